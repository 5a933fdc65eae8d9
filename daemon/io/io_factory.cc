#include "daemon/io/io_factory.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/io/memory_backend.h"
#include "daemon/io/uring_cmd_backend.h"
#include "daemon/io/uring_backend.h"

namespace tutti::io {
namespace {

using Factory = absl::StatusOr<std::unique_ptr<IoBackend>> (*)(std::vector<int>,
                                                               std::vector<uint64_t>,
                                                               const IoOptions&);

absl::StatusOr<std::unique_ptr<IoBackend>> MakeUring(std::vector<int> fds,
                                                     std::vector<uint64_t> sizes,
                                                     const IoOptions& options) {
  auto backend = UringBackend::Create(std::move(fds), UringOptions{options.queue_depth});
  if (!backend.ok()) return backend.status();
  if (!sizes.empty()) {
    if (sizes.size() != (*backend)->num_files()) {
      return absl::InvalidArgumentError(absl::StrCat("uring backend: ", (*backend)->num_files(),
                                                     " pool files but ", sizes.size(), " sizes"));
    }
    for (uint32_t f = 0; f < sizes.size(); ++f) {
      if ((*backend)->file_size(f) != sizes[f]) {
        return absl::FailedPreconditionError(absl::StrCat("pool file ", f, " is ",
                                                          (*backend)->file_size(f),
                                                          " bytes; its layout says ", sizes[f]));
      }
    }
  }
  return std::unique_ptr<IoBackend>(*std::move(backend));
}

absl::StatusOr<std::unique_ptr<IoBackend>> MakeMemory(std::vector<int> fds,
                                                      std::vector<uint64_t> sizes,
                                                      const IoOptions&) {
  for (int fd : fds) close(fd);
  auto backend = MemoryBackend::Create(std::move(sizes));
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<IoBackend>(*std::move(backend));
}

// `fds`: the namespaces' char devices (OpenPassthroughDevices). A size, if given, is the pool
// file's and must fit in its namespace.
absl::StatusOr<std::unique_ptr<IoBackend>> MakeUringCmd(std::vector<int> fds,
                                                        std::vector<uint64_t> sizes,
                                                        const IoOptions& options) {
  UringCmdOptions o;
  o.queue_depth = options.queue_depth;
  auto backend = UringCmdBackend::Create(std::move(fds), o);
  if (!backend.ok()) return backend.status();
  for (uint32_t f = 0; f < sizes.size() && f < (*backend)->num_files(); ++f) {
    if (sizes[f] > (*backend)->file_size(f)) {
      return absl::FailedPreconditionError(
          absl::StrCat((*backend)->info(f).device, " holds ", (*backend)->file_size(f),
                       " bytes; pool file ", f, " needs ", sizes[f]));
    }
  }
  return std::unique_ptr<IoBackend>(*std::move(backend));
}

struct Entry {
  std::string_view name;
  Factory make;
};
constexpr Entry kBackends[] = {
    {"uring", &MakeUring}, {"memory", &MakeMemory}, {"uring_cmd", &MakeUringCmd}};

}  // namespace

std::vector<std::string_view> IoBackendNames() {
  std::vector<std::string_view> names;
  for (const Entry& e : kBackends) names.push_back(e.name);
  return names;
}

absl::StatusOr<std::unique_ptr<IoBackend>> CreateIoBackend(std::string_view name,
                                                           std::vector<int> fds,
                                                           std::vector<uint64_t> file_sizes,
                                                           const IoOptions& options) {
  for (const Entry& e : kBackends) {
    if (e.name == name) return e.make(std::move(fds), std::move(file_sizes), options);
  }
  for (int fd : fds) close(fd);
  std::string allowed;
  for (std::string_view n : IoBackendNames()) {
    absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", std::string(n));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("io.backend: unknown backend \"", std::string(name), "\"; allowed: ", allowed));
}

}  // namespace tutti::io
