// The fake libcufile (fake_cufile.h). Its types are declared here again, in cufile.h's layout,
// independently of daemon/io/cufile_api.h, so the backend is tested against the ABI and not
// against its own header.
#include "daemon/io/testing/fake_cufile.h"

#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace {

struct CUfileError_t {
  int err;
  int cu_err;
};
struct CUfileDescr_t {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

constexpr int kDriverNotInitialized = 5001;
constexpr int kInvalidValue = 5022;
constexpr int kMemoryAlreadyRegistered = 5023;
constexpr int kMemoryNotRegistered = 5024;
constexpr int kHandleNotRegistered = 5027;
constexpr int kInvalidFileType = 5018;

struct FakeHandle {
  int fd;
};

struct State {
  std::mutex mu;
  int64_t driver_open = 0;
  std::map<const FakeHandle*, int> handles;
  std::map<const char*, size_t> buffers;  // base -> length
  FakeCuFileStats stats{};
};

State& S() {
  static State* s = new State;
  return *s;
}

// The code in environment variable `name`, or 0.
int EnvCode(const char* name) {
  const char* v = getenv(name);
  return v == nullptr ? 0 : atoi(v);
}

CUfileError_t Err(int code) { return CUfileError_t{code, 0}; }

// FAKE_CUFILE_FAIL_READ=OFFSET:CODE matching `offset`: the code to fail with, else 0.
int ReadFailure(off_t offset) {
  const char* v = getenv("FAKE_CUFILE_FAIL_READ");
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long long at = strtoll(v, &end, 10);
  if (end == nullptr || *end != ':' || at != offset) return 0;
  return atoi(end + 1);
}

// The fd of `fh` and whether `base` is a registered buffer that holds [offset, offset + size);
// -CUfileOpError when the call is invalid.
ssize_t Check(void* fh, const void* base, size_t size, off_t buf_offset, int* fd,
              bool* registered) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.driver_open <= 0) return -kDriverNotInitialized;
  auto h = s.handles.find(static_cast<const FakeHandle*>(fh));
  if (h == s.handles.end()) return -kHandleNotRegistered;
  *fd = h->second;
  auto b = s.buffers.find(static_cast<const char*>(base));
  *registered = b != s.buffers.end();
  if (*registered && (buf_offset < 0 || static_cast<size_t>(buf_offset) + size > b->second)) {
    return -kInvalidValue;
  }
  if (!*registered && buf_offset < 0) return -kInvalidValue;
  return 0;
}

void Count(bool read, bool registered) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  ++(read ? s.stats.reads : s.stats.writes);
  if (registered) ++s.stats.registered_calls;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUfileError_t cuFileDriverOpen() {
  if (int code = EnvCode("FAKE_CUFILE_FAIL_DRIVER_OPEN")) return Err(code);
  std::lock_guard<std::mutex> lock(S().mu);
  ++S().driver_open;
  return Err(0);
}

__attribute__((visibility("default"))) CUfileError_t cuFileDriverClose_v2() {
  std::lock_guard<std::mutex> lock(S().mu);
  if (S().driver_open <= 0) return Err(kDriverNotInitialized);
  --S().driver_open;
  return Err(0);
}

__attribute__((visibility("default"))) CUfileError_t cuFileDriverClose() {
  return cuFileDriverClose_v2();
}

__attribute__((visibility("default"))) CUfileError_t cuFileHandleRegister(void** fh,
                                                                          CUfileDescr_t* descr) {
  if (int code = EnvCode("FAKE_CUFILE_FAIL_HANDLE_REGISTER")) return Err(code);
  if (fh == nullptr || descr == nullptr || descr->type != 1) return Err(kInvalidValue);
  if (descr->handle.fd < 0) return Err(kInvalidFileType);
  std::lock_guard<std::mutex> lock(S().mu);
  if (S().driver_open <= 0) return Err(kDriverNotInitialized);
  auto* h = new FakeHandle{descr->handle.fd};
  S().handles[h] = h->fd;
  ++S().stats.handles;
  *fh = h;
  return Err(0);
}

__attribute__((visibility("default"))) void cuFileHandleDeregister(void* fh) {
  std::lock_guard<std::mutex> lock(S().mu);
  auto* h = static_cast<FakeHandle*>(fh);
  if (S().handles.erase(h) == 0) return;
  --S().stats.handles;
  delete h;
}

__attribute__((visibility("default"))) CUfileError_t cuFileBufRegister(const void* base,
                                                                       size_t length, int) {
  if (int code = EnvCode("FAKE_CUFILE_FAIL_BUF_REGISTER")) return Err(code);
  std::lock_guard<std::mutex> lock(S().mu);
  if (S().driver_open <= 0) return Err(kDriverNotInitialized);
  if (base == nullptr || length == 0) return Err(kInvalidValue);
  if (!S().buffers.emplace(static_cast<const char*>(base), length).second) {
    return Err(kMemoryAlreadyRegistered);
  }
  ++S().stats.buffers;
  return Err(0);
}

__attribute__((visibility("default"))) CUfileError_t cuFileBufDeregister(const void* base) {
  std::lock_guard<std::mutex> lock(S().mu);
  if (S().buffers.erase(static_cast<const char*>(base)) == 0) return Err(kMemoryNotRegistered);
  --S().stats.buffers;
  return Err(0);
}

__attribute__((visibility("default"))) ssize_t cuFileRead(void* fh, void* base, size_t size,
                                                          off_t file_offset, off_t buf_offset) {
  int fd = -1;
  bool registered = false;
  if (ssize_t bad = Check(fh, base, size, buf_offset, &fd, &registered)) return bad;
  if (int code = ReadFailure(file_offset)) {
    if (code > 5000) return -code;
    errno = code;
    return -1;
  }
  const ssize_t n = pread(fd, static_cast<char*>(base) + buf_offset, size, file_offset);
  if (n >= 0) Count(true, registered);
  return n;
}

__attribute__((visibility("default"))) ssize_t cuFileWrite(void* fh, const void* base, size_t size,
                                                           off_t file_offset, off_t buf_offset) {
  int fd = -1;
  bool registered = false;
  if (ssize_t bad = Check(fh, base, size, buf_offset, &fd, &registered)) return bad;
  const ssize_t n = pwrite(fd, static_cast<const char*>(base) + buf_offset, size, file_offset);
  if (n >= 0) Count(false, registered);
  return n;
}

__attribute__((visibility("default"))) void fake_cufile_stats(FakeCuFileStats* out) {
  std::lock_guard<std::mutex> lock(S().mu);
  *out = S().stats;
  out->driver_open = S().driver_open;
}

}  // extern "C"
