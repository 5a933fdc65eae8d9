// The "gds" I/O backend: GPUDirect Storage through NVIDIA's cuFile, loaded at run time (dlopen, see
// cufile_api.h): tuttid neither links nor needs libcufile, and a host without it runs "uring".
//
// Create detects whether cuFile can move data on this host, in this order, and answers UNAVAILABLE
// with the first reason it meets (the caller falls back, io_factory.h):
//   1. the daemon runs in host mode: there is no GPU-visible staging for cuFile to move into;
//   2. libcufile cannot be opened or lacks an entry point (dlerror's text);
//   3. cuFileDriverOpen fails (no nvidia-fs and no compatibility mode, driver mismatch);
//   4. cuFileHandleRegister fails on a pool file (a file system cuFile does not take: on a virtio
//      ext4 disk it answers CU_FILE_HANDLE_NOT_REGISTERED, 5027, even in compatibility mode).
// The cuFile code is named in words, e.g. "gds: cuFileHandleRegister(pool file 0): "
// "CU_FILE_HANDLE_NOT_REGISTERED (5027)".
//
// I/O: one owner thread per pool file holds that file's cuFile handle and issues its requests one
// at a time with cuFileRead / cuFileWrite (synchronous), in the order they arrived. A
// request inside the buffer given to RegisterBuffer is passed as (registered base, offset), so
// cuFile uses its registration; any other buffer is passed as its own base (cuFile bounces it).
// A short transfer is continued until it is complete or cuFile moves nothing more; `result` is then
// the bytes moved. Errors: -errno for a file system error, -EIO for a cuFile error (its code is
// logged, rate-limited).
//
// Thread-safety: as IoBackend. Each cuFile handle is used only by its owner thread.
#ifndef TUTTI_DAEMON_IO_GDS_BACKEND_H_
#define TUTTI_DAEMON_IO_GDS_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/io/io_backend.h"

namespace tutti::io {

namespace cufile {
class CuFileLibrary;
}

struct GdsOptions {
  // The cuFile library to open: a path or a soname; empty: "libcufile.so.0", then "libcufile.so".
  std::string library;
  // True when the daemon runs in cuda mode, so the staging it registers is visible to the GPU.
  // False (host mode) makes Create answer UNAVAILABLE before touching cuFile.
  bool gpu_staging = false;
};

// Counts since creation, summed over files. Approximate while I/O is running.
struct GdsCounters {
  uint64_t registered_buffer_ops = 0;  // cuFile calls on the registered buffer (base + offset)
  uint64_t plain_buffer_ops = 0;       // cuFile calls on any other buffer
  uint64_t cufile_errors = 0;          // calls that returned a cuFile error or -1 with errno
};

class GdsBackend final : public IoBackend {
 public:
  // Detects cuFile (above) and registers every fd of `*fds` (pool files opened O_DIRECT, in pool
  // order) with it. On success the backend owns the fds (`*fds` is emptied; they are closed when
  // it is destroyed). On any error `*fds` is left as it was and stays the caller's, so the caller
  // can fall back over the same files. Errors: UNAVAILABLE (cuFile cannot run here; the message
  // starts "gds: " and is the reason to show); INVALID_ARGUMENT for no fds or a file that cannot be
  // sized.
  static absl::StatusOr<std::unique_ptr<GdsBackend>> Create(std::vector<int>* fds,
                                                            const GdsOptions& options);
  // Waits for every submitted batch to complete (each `done` runs), stops the threads, deregisters
  // the buffer and the handles, closes the driver and the fds, then unloads libcufile.
  ~GdsBackend() override;

  std::string_view name() const override { return "gds"; }
  uint32_t num_files() const override { return static_cast<uint32_t>(sizes_.size()); }
  uint64_t file_size(uint32_t file) const override { return sizes_[file]; }
  // The library actually opened, e.g. "libcufile.so.0".
  const std::string& library() const;

  // cuFileBufRegister(region). FAILED_PRECONDITION once a buffer is registered; INVALID_ARGUMENT
  // for an empty region; UNAVAILABLE naming the cuFile code when cuFile refuses (the backend then
  // passes every buffer as its own base, and the call may be retried).
  [[nodiscard]] absl::Status RegisterBuffer(absl::Span<uint8_t> region) override;
  void Submit(absl::Span<IoRequest> batch, std::function<void()> done) override;
  // fdatasync on the calling thread. INVALID_ARGUMENT for a bad index; INTERNAL on failure.
  [[nodiscard]] absl::Status Sync(uint32_t file) override;

  GdsCounters counters() const;
  // tutti_io_gds_*: counters() as families.
  void RegisterStats(stats::Registry* registry) const override;

 private:
  class FileQueue;
  struct Registered {
    std::atomic<uint8_t*> base{nullptr};
    std::atomic<uint64_t> len{0};
  };
  GdsBackend(std::unique_ptr<cufile::CuFileLibrary> lib, bool close_driver);

  std::unique_ptr<cufile::CuFileLibrary> lib_;  // declared first: unloaded last
  const bool close_driver_;                     // this backend's cuFileDriverOpen took
  std::vector<uint64_t> sizes_;
  std::vector<int> fds_;
  Registered registered_;
  std::atomic<bool> buffer_taken_{false};
  std::vector<std::unique_ptr<FileQueue>> queues_;  // declared last: stopped first
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_GDS_BACKEND_H_
