#include "daemon/io/io_factory.h"

#include <unistd.h>

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/io/backend_registry.h"
#include "daemon/io/gds_backend.h"
#include "daemon/io/memory_backend.h"
#include "daemon/io/nvme_open.h"
#include "daemon/io/uring_cmd_backend.h"
#include "daemon/io/uring_backend.h"

namespace tutti::io {
namespace {

// Each factory takes the fds it succeeds with; on error `*fds` holds those still open (for
// OpenIoBackend's fallback, or to be closed).
using Factory = absl::StatusOr<std::unique_ptr<IoBackend>> (*)(std::vector<int>* fds,
                                                               std::vector<uint64_t>,
                                                               const IoOptions&);

void CloseAll(std::vector<int>* fds) {
  for (int fd : *fds) close(fd);
  fds->clear();
}

absl::StatusOr<std::unique_ptr<IoBackend>> MakeUring(std::vector<int>* fds,
                                                     std::vector<uint64_t>,
                                                     const IoOptions& options) {
  std::vector<int> taken = std::move(*fds);  // Create closes them on error too
  fds->clear();
  return CreateUringBackend(std::move(taken),
                            UringOptions{options.queue_depth, options.memory_read_workers});
}

absl::StatusOr<std::unique_ptr<IoBackend>> MakeMemory(std::vector<int>* fds,
                                                      std::vector<uint64_t> sizes,
                                                      const IoOptions&) {
  CloseAll(fds);
  auto backend = MemoryBackend::Create(std::move(sizes));
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<IoBackend>(*std::move(backend));
}

absl::StatusOr<std::unique_ptr<IoBackend>> MakeGds(std::vector<int>* fds, std::vector<uint64_t>,
                                                   const IoOptions& options) {
  auto backend = GdsBackend::Create(fds, options.gds);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<IoBackend>(*std::move(backend));
}

// `fds`: the namespaces' char devices (OpenPassthroughDevices). A size, if given, is the pool
// file's and must fit in its namespace.
absl::StatusOr<std::unique_ptr<IoBackend>> MakeUringCmd(std::vector<int>* fds,
                                                        std::vector<uint64_t> sizes,
                                                        const IoOptions& options) {
  UringCmdOptions o;
  o.queue_depth = options.queue_depth;
  std::vector<int> taken = std::move(*fds);  // Create closes them on error too
  fds->clear();
  auto backend = UringCmdBackend::Create(std::move(taken), o);
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

// Each "file" is a whole namespace of options.nvme (nvme_open.h); `fds` are not used (left for
// the fallback, closed by the caller). A size, if given, must fit in its namespace.
absl::StatusOr<std::unique_ptr<IoBackend>> MakeNvme(std::vector<int>*, std::vector<uint64_t> sizes,
                                                    const IoOptions& options) {
  NvmeOpenOptions o = options.nvme;
  o.queue_depth = options.queue_depth;
  auto backend = OpenNvmeBackend(o);
  if (!backend.ok()) return backend.status();
  for (uint32_t f = 0; f < sizes.size() && f < (*backend)->num_files(); ++f) {
    if (sizes[f] > (*backend)->file_size(f)) {
      return absl::FailedPreconditionError(
          absl::StrCat("nvme ", o.pci_addresses[f], " namespace ", o.nsid, " holds ",
                       (*backend)->file_size(f), " bytes; pool file ", f, " needs ", sizes[f]));
    }
  }
  return backend;
}

// The factories, one per entry of backend_registry.h's kBackends, in its order.
struct Entry {
  std::string_view name;
  Factory make;
};
constexpr Entry kFactories[] = {{"uring", &MakeUring},
                                {"memory", &MakeMemory},
                                {"gds", &MakeGds},
                                {"uring_cmd", &MakeUringCmd},
                                {"nvme", &MakeNvme}};

constexpr bool FactoriesFollowTheRegistry() {
  if (std::size(kFactories) != kBackends.size()) return false;
  for (size_t i = 0; i < kBackends.size(); ++i) {
    if (kFactories[i].name != kBackends[i].name) return false;
  }
  return true;
}
static_assert(FactoriesFollowTheRegistry(),
              "kFactories must list backend_registry.h's backends, in its order");

// A pool file that does not match its layout.
absl::Status CheckSizes(const IoBackend& backend, const std::vector<uint64_t>& sizes) {
  if (sizes.empty()) return absl::OkStatus();
  if (sizes.size() != backend.num_files()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(backend.name()), " backend: ",
                                                   backend.num_files(), " pool files but ",
                                                   sizes.size(), " sizes"));
  }
  for (uint32_t f = 0; f < sizes.size(); ++f) {
    if (backend.file_size(f) != sizes[f]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pool file ", f, " is ", backend.file_size(f), " bytes; its layout says ", sizes[f]));
    }
  }
  return absl::OkStatus();
}

// The backend `name` (fds as Factory; INVALID_ARGUMENT for an unknown name, fds untouched).
absl::StatusOr<std::unique_ptr<IoBackend>> Make(std::string_view name, std::vector<int>* fds,
                                                const std::vector<uint64_t>& sizes,
                                                const IoOptions& options) {
  for (size_t i = 0; i < kBackends.size(); ++i) {
    if (kBackends[i].name != name) continue;
    auto backend = kFactories[i].make(fds, sizes, options);
    if (!backend.ok()) return backend.status();
    // On whole devices a size must fit in its namespace (the factory checks); a file's must
    // equal its layout's.
    if (!OnWholeDevices(kBackends[i].places)) {
      absl::Status fits = CheckSizes(**backend, sizes);
      if (!fits.ok()) return fits;
    }
    return backend;
  }
  std::string allowed;
  for (std::string_view n : IoBackendNames()) {
    absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", std::string(n));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("io.backend: unknown backend \"", std::string(name), "\"; allowed: ", allowed));
}

}  // namespace

std::vector<std::string_view> IoBackendNames() {
  return std::vector<std::string_view>(kBackendNames.begin(), kBackendNames.end());
}

absl::StatusOr<std::unique_ptr<IoBackend>> CreateIoBackend(std::string_view name,
                                                           std::vector<int> fds,
                                                           std::vector<uint64_t> file_sizes,
                                                           const IoOptions& options) {
  auto backend = Make(name, &fds, file_sizes, options);
  CloseAll(&fds);
  return backend;
}

absl::StatusOr<OpenedBackend> OpenIoBackend(std::string_view requested, std::vector<int> fds,
                                            std::vector<uint64_t> file_sizes,
                                            const IoOptions& options) {
  if (!options.fallback.empty() && options.fallback != "uring" && options.fallback != "fail") {
    CloseAll(&fds);
    return absl::InvalidArgumentError(absl::StrCat(
        "io.fallback: \"", options.fallback, "\" is not one of \"uring\", \"fail\""));
  }
  OpenedBackend opened;
  opened.choice.requested = std::string(requested);
  auto backend = Make(requested, &fds, file_sizes, options);
  if (backend.ok()) {
    CloseAll(&fds);
    opened.backend = *std::move(backend);
    opened.choice.backend = opened.choice.requested;
    return opened;
  }
  if (!absl::IsUnavailable(backend.status()) || requested == "uring") {
    CloseAll(&fds);
    return backend.status();
  }
  if (options.fallback == "fail") {
    CloseAll(&fds);
    return absl::FailedPreconditionError(
        absl::StrCat("io.backend \"", std::string(requested),
                     "\" cannot run on this host and io.fallback is \"fail\": ",
                     backend.status().message()));
  }
  opened.choice.reason = std::string(backend.status().message());
  auto uring = Make("uring", &fds, file_sizes, options);
  CloseAll(&fds);
  if (!uring.ok()) {
    return absl::Status(uring.status().code(),
                        absl::StrCat("fallback to uring (", opened.choice.reason,
                                     ") failed: ", uring.status().message()));
  }
  opened.backend = *std::move(uring);
  opened.choice.backend = "uring";
  return opened;
}

}  // namespace tutti::io
