// The registry of tuttid's I/O backends: the values `io.backend` takes (config validates against
// kBackendNames), where each one keeps the pool, and the values of `io.fallback`. One table;
// io_factory.cc's table of factories follows it (checked at compile time), so a new backend is
// its folder or files in daemon/io plus one line here and one there.
//
// Header-only and without dependencies: config/ and the daemon read it without linking a backend.
#ifndef TUTTI_DAEMON_IO_BACKEND_REGISTRY_H_
#define TUTTI_DAEMON_IO_BACKEND_REGISTRY_H_

#include <array>
#include <cstddef>
#include <string_view>

namespace tutti::io {

// Where a backend's pool lives, which decides what OpenIoBackend (io_factory.h) hands it.
enum class PoolPlaces : unsigned char {
  kFiles,        // pre-allocated O_DIRECT files, one per pool.dirs entry
  kMemory,       // host memory the size of those files; nothing persists
  kCharDevices,  // whole NVMe namespaces through their generic char devices, io.passthrough_devices
  kPciDevices,   // whole NVMe namespaces of SSDs bound to vfio-pci, io.nvme_devices
};

struct BackendSpec {
  std::string_view name;  // as io.backend spells it
  PoolPlaces places;
  // The setting that lists the devices, for the backends on whole namespaces; "" otherwise.
  std::string_view devices_field;
};

inline constexpr std::array<BackendSpec, 5> kBackends = {{
    {"uring", PoolPlaces::kFiles, ""},
    {"memory", PoolPlaces::kMemory, ""},
    {"gds", PoolPlaces::kFiles, ""},
    {"uring_cmd", PoolPlaces::kCharDevices, "io.passthrough_devices"},
    {"nvme", PoolPlaces::kPciDevices, "io.nvme_devices"},
}};

namespace registry_internal {
constexpr std::array<std::string_view, kBackends.size()> NamesOf() {
  std::array<std::string_view, kBackends.size()> names{};
  for (std::size_t i = 0; i < kBackends.size(); ++i) names[i] = kBackends[i].name;
  return names;
}
}  // namespace registry_internal

// The names, in the table's order: "uring", "memory", "gds", "uring_cmd", "nvme".
inline constexpr std::array<std::string_view, kBackends.size()> kBackendNames =
    registry_internal::NamesOf();

// The backend called `name`, or null.
constexpr const BackendSpec* FindBackend(std::string_view name) {
  for (const BackendSpec& b : kBackends) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

// True for the backends whose "files" are whole namespaces (the pool laid out over the devices).
constexpr bool OnWholeDevices(PoolPlaces p) {
  return p == PoolPlaces::kCharDevices || p == PoolPlaces::kPciDevices;
}

// What runs when the requested backend cannot run on this host (backend_choice.h).
inline constexpr std::string_view kFallbackBackend = "uring";
// The values io.fallback takes: "" and "uring" fall back to kFallbackBackend, "fail" refuses.
inline constexpr std::array<std::string_view, 3> kFallbackValues = {"", "uring", "fail"};

static_assert(FindBackend(kFallbackBackend) != nullptr &&
                  FindBackend(kFallbackBackend)->places == PoolPlaces::kFiles,
              "the fallback runs over the pool files of pool.dirs");

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_BACKEND_REGISTRY_H_
