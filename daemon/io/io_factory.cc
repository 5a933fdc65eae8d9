#include "daemon/io/io_factory.h"

#include <unistd.h>

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
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
  return CreateUringBackend(
      std::move(taken),
      UringOptions{options.queue_depth, options.memory_read_workers, options.memory_read_rings});
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

// `fds`: the namespaces' char devices (OpenPassthroughDevices), or none: then those of
// options.passthrough_devices, opened here. A size, if given, is the pool file's and must fit in
// its namespace. Failing to open or use the devices is UNAVAILABLE (io_factory.h).
absl::StatusOr<std::unique_ptr<IoBackend>> MakeUringCmd(std::vector<int>* fds,
                                                        std::vector<uint64_t> sizes,
                                                        const IoOptions& options) {
  // Passthrough cannot run here, unless the configuration itself is wrong.
  auto cannot_run = [](const absl::Status& s) {
    return absl::IsInvalidArgument(s) ? s : absl::UnavailableError(s.message());
  };
  std::vector<int> taken = std::move(*fds);  // Create closes them on error too
  fds->clear();
  if (taken.empty()) {
    auto opened = OpenPassthroughDevices(options.passthrough_devices);
    if (!opened.ok()) return cannot_run(opened.status());
    taken = *std::move(opened);
  }
  UringCmdOptions o;
  o.queue_depth = options.queue_depth;
  auto backend = UringCmdBackend::Create(std::move(taken), o);
  if (!backend.ok()) return cannot_run(backend.status());
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

// Closes whatever fds are left in `*fds` when it goes out of scope.
class FdsCloser {
 public:
  explicit FdsCloser(std::vector<int>* fds) : fds_(fds) {}
  ~FdsCloser() { CloseAll(fds_); }
  FdsCloser(const FdsCloser&) = delete;
  FdsCloser& operator=(const FdsCloser&) = delete;

 private:
  std::vector<int>* fds_;
};

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

absl::StatusOr<OpenedBackend> OpenIoBackend(std::string_view requested,
                                            const PoolFilesSource& files,
                                            const IoOptions& options) {
  RETURN_IF_ERROR(CheckFallbackSetting(options.fallback));
  const BackendSpec* spec = FindBackend(requested);
  PoolFileSet pool;  // what `files` gave, once asked
  FdsCloser closer(&pool.fds);
  const bool over_files = spec != nullptr && spec->places == PoolPlaces::kFiles;
  if (spec != nullptr && !OnWholeDevices(spec->places)) {
    ASSIGN_OR_RETURN(pool, files(over_files));
  }
  OpenedBackend opened;
  auto backend = Make(requested, &pool.fds, pool.sizes, options);
  if (backend.ok()) {
    opened.backend = *std::move(backend);
    opened.choice = Chosen(requested);
    return opened;
  }
  ASSIGN_OR_RETURN(opened.choice, ChooseFallback(requested, options.fallback, backend.status()));
  log::Get("io")->warn("{}; falling back to {} on pool.dirs (io.fallback \"{}\")",
                       opened.choice.reason, opened.choice.backend, options.fallback);
  // The fallback runs over the pool files: those a backend over files left, or now opened.
  absl::Status fallback_failed;
  if (!over_files) {
    auto opened_files = files(true);
    if (opened_files.ok()) {
      pool = *std::move(opened_files);
    } else {
      fallback_failed = opened_files.status();
    }
  }
  if (fallback_failed.ok()) {
    auto uring = Make(kFallbackBackend, &pool.fds, pool.sizes, options);
    if (uring.ok()) {
      opened.backend = *std::move(uring);
      return opened;
    }
    fallback_failed = uring.status();
  }
  return absl::Status(fallback_failed.code(),
                      absl::StrCat("fallback to ", std::string(kFallbackBackend), " (",
                                   opened.choice.reason, ") failed: ", fallback_failed.message()));
}

absl::StatusOr<OpenedBackend> OpenIoBackend(std::string_view requested, std::vector<int> fds,
                                            std::vector<uint64_t> file_sizes,
                                            const IoOptions& options) {
  FdsCloser closer(&fds);  // those not handed over
  return OpenIoBackend(
      requested,
      [&](bool open) -> absl::StatusOr<PoolFileSet> {
        PoolFileSet set;
        set.sizes = file_sizes;
        if (open) set.fds = std::exchange(fds, {});
        return set;
      },
      options);
}

}  // namespace tutti::io
