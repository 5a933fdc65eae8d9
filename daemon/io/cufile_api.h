// Internal to daemon/io: the part of NVIDIA's cuFile (GPUDirect Storage) C API that the "gds"
// backend uses, declared here so that nothing includes cufile.h or links libcufile. The layouts
// and the numeric codes follow NVIDIA's public cufile.h (CUDA 12 and 13); libcufile is opened at
// run time with dlopen (CuFileLibrary::Load), and its absence only makes the backend unavailable.
//
// Thread-safety: a loaded CuFileLibrary is immutable; cuFile's own calls are thread-safe.
#ifndef TUTTI_DAEMON_IO_CUFILE_API_H_
#define TUTTI_DAEMON_IO_CUFILE_API_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tutti::io::cufile {

// CUfileOpError: 0, or 5000 plus a small number. Only the codes this code names are listed;
// CodeName knows them all.
inline constexpr int kBaseErr = 5000;
inline constexpr int kSuccess = 0;
inline constexpr int kDriverNotInitialized = 5001;
inline constexpr int kDriverAlreadyOpen = 5026;

// CUfileError_t: `err` is a CUfileOpError; `cu_err` the CUDA driver's CUresult when err is
// CU_FILE_CUDA_DRIVER_ERROR (5011).
struct Error {
  int err;
  int cu_err;
};

inline constexpr int kHandleTypeOpaqueFd = 1;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD

// CUfileDescr_t.
struct Descr {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;  // CUfileFSOps_t*, null for an fd
};

using Handle = void*;  // CUfileHandle_t

// The entry points, as cufile.h declares them (cuFileDriverClose is its _v2 since CUDA 12.x).
struct Api {
  Error (*driver_open)();
  Error (*driver_close)();
  Error (*handle_register)(Handle* fh, Descr* descr);
  void (*handle_deregister)(Handle fh);
  Error (*buf_register)(const void* base, size_t length, int flags);
  Error (*buf_deregister)(const void* base);
  // Bytes moved (>= 0); -1 with errno set for a file system error; -CUfileOpError otherwise.
  ssize_t (*read)(Handle fh, void* base, size_t size, off_t file_offset, off_t buf_offset);
  ssize_t (*write)(Handle fh, const void* base, size_t size, off_t file_offset, off_t buf_offset);
};

// "CU_FILE_HANDLE_NOT_REGISTERED (5027)"; "CU_FILE_CUDA_DRIVER_ERROR (5011, CUresult 2)"; an
// unknown code as "cuFile error 5099".
std::string ErrorText(const Error& e);
std::string CodeName(int code);

// libcufile, opened with dlopen and its entry points resolved. Closed (dlclose) on destruction:
// everything obtained through api() must be released first.
class CuFileLibrary {
 public:
  // Opens `path`, or when it is empty the first of "libcufile.so.0", "libcufile.so" that the
  // dynamic loader finds. UNAVAILABLE, with dlerror's text, if none opens or an entry point is
  // missing.
  static absl::StatusOr<std::unique_ptr<CuFileLibrary>> Load(const std::string& path);
  ~CuFileLibrary();
  CuFileLibrary(const CuFileLibrary&) = delete;
  CuFileLibrary& operator=(const CuFileLibrary&) = delete;

  const Api& api() const { return api_; }
  const std::string& path() const { return path_; }  // the name it was opened by

 private:
  CuFileLibrary(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  absl::Status Resolve();

  void* handle_;
  std::string path_;
  Api api_{};
};

}  // namespace tutti::io::cufile

#endif  // TUTTI_DAEMON_IO_CUFILE_API_H_
