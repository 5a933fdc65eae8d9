// Which I/O backend start-up chose, and why: one value shown in the log, in Admin.Status
// (io_backend, io_backend_requested, io_backend_reason) and in the metric tutti_io_backend_info.
// Every backend that can fall back (gds, uring_cmd, nvme) reports through this one type.
#ifndef TUTTI_DAEMON_IO_BACKEND_CHOICE_H_
#define TUTTI_DAEMON_IO_BACKEND_CHOICE_H_

#include <string>

namespace tutti::io {

struct BackendChoice {
  std::string backend;    // the backend running, e.g. "uring"
  std::string requested;  // io.backend as configured (the default filled in), e.g. "gds"
  // Empty when backend == requested; otherwise why the requested one could not run, in words,
  // starting with its name, e.g. "gds: cuFileHandleRegister(pool file 0): CU_FILE_... (5027)".
  std::string reason;

  bool fell_back() const { return backend != requested; }
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_BACKEND_CHOICE_H_
