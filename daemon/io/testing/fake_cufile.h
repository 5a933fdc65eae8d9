// A stand-in for NVIDIA's libcufile, for tests on machines without GPUDirect Storage: a shared
// library (//daemon/io/testing:libfake_cufile.so) exporting the cuFile entry points the "gds"
// backend resolves (daemon/io/cufile_api.h), backed by pread / pwrite on the registered fds into
// host memory that stands in for GPU memory.
//
// Failure switches, read from the environment at each call (set them before the call they aim at):
//   FAKE_CUFILE_FAIL_DRIVER_OPEN=CODE     cuFileDriverOpen answers CUfileOpError CODE
//   FAKE_CUFILE_FAIL_HANDLE_REGISTER=CODE cuFileHandleRegister answers CODE
//   FAKE_CUFILE_FAIL_BUF_REGISTER=CODE    cuFileBufRegister answers CODE
//   FAKE_CUFILE_FAIL_READ=OFFSET:CODE     a cuFileRead starting at file byte OFFSET fails: CODE
//                                         above 5000 returns -CODE, otherwise -1 with errno CODE
//
// Tests read what happened through fake_cufile_stats (dlsym it from the same dlopen path: the
// loader hands back the one loaded copy). Thread-safe.
#ifndef TUTTI_DAEMON_IO_TESTING_FAKE_CUFILE_H_
#define TUTTI_DAEMON_IO_TESTING_FAKE_CUFILE_H_

#include <cstdint>

extern "C" {

struct FakeCuFileStats {
  int64_t driver_open;         // cuFileDriverOpen calls that succeeded less cuFileDriverClose calls
  int64_t handles;             // handles registered now
  int64_t buffers;             // buffers registered now
  uint64_t reads, writes;      // cuFileRead / cuFileWrite calls that moved data
  uint64_t registered_calls;   // of those, the ones whose base is a registered buffer
};

void fake_cufile_stats(FakeCuFileStats* out);
}

#endif  // TUTTI_DAEMON_IO_TESTING_FAKE_CUFILE_H_
