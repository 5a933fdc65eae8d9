// gds_probe: says whether GPUDirect Storage (cuFile) can move data on this host, through the very
// detection tuttid runs at start (io::OpenIoBackend with io.backend "gds", daemon/io/gds_backend.h),
// and shows the fallback to uring with its reason where it cannot. Run by gpu/gds_probe.sh.
//
//   gds_probe [--dir=DIR] [--library=PATH]
//
// DIR: where the probe's 1 MiB pool file goes (default /var/tmp; the file is removed). PATH: the
// libcufile to open (default: libcufile.so.0, then libcufile.so, as tuttid). Prints "key: value"
// lines; exits 0 when it could report, 2 on bad usage or when DIR takes no O_DIRECT file.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/cufile_api.h"
#include "daemon/io/io_factory.h"

ABSL_FLAG(std::string, dir, "/var/tmp", "directory for the probe's pool file (O_DIRECT)");
ABSL_FLAG(std::string, library, "", "libcufile to open; empty: libcufile.so.0, libcufile.so");

namespace tutti::io {
namespace {

constexpr uint32_t kBytes = 1 << 20;

// Writes a pattern through `b` and reads it back; "yes" or what went wrong.
std::string RoundTrip(IoBackend* b) {
  AlignedBuffer staging(2 * 65536);
  const absl::Status reg = b->RegisterBuffer(staging.span());
  std::printf("buffer registered: %s (host memory: the probe allocates no GPU memory)\n",
              reg.ok() ? "yes" : std::string(reg.message()).c_str());
  for (uint32_t i = 0; i < 65536; ++i) staging.data()[i] = static_cast<uint8_t>(i * 13 + 1);
  IoRequest w{Op::kWrite, 0, 65536, staging.data(), 65536};
  b->Execute(absl::MakeSpan(&w, 1));
  if (w.result != 65536) return "no: write result " + std::to_string(w.result);
  IoRequest r{Op::kRead, 0, 65536, staging.data() + 65536, 65536};
  b->Execute(absl::MakeSpan(&r, 1));
  if (r.result != 65536) return "no: read result " + std::to_string(r.result);
  return std::memcmp(staging.data(), staging.data() + 65536, 65536) == 0 ? "yes"
                                                                         : "no: bytes differ";
}

int Probe(const std::string& dir, const std::string& library) {
  auto lib = cufile::CuFileLibrary::Load(library);
  std::printf("cufile library: %s\n",
              lib.ok() ? (*lib)->path().c_str() : std::string(lib.status().message()).c_str());
  lib = absl::UnavailableError("");  // the backend loads its own copy
  const std::string path = dir + "/gds_probe." + std::to_string(getpid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, kBytes) != 0) {
    std::printf("error: %s: %s (needs a file system that takes O_DIRECT)\n", path.c_str(),
                std::strerror(errno));
    return 2;
  }
  unlink(path.c_str());  // the fd keeps it until the backend closes it
  IoOptions options;
  options.gds.library = library;
  options.gds.gpu_staging = true;  // as in cuda mode: the probe asks cuFile itself
  auto opened = OpenIoBackend("gds", {fd}, {kBytes}, options);
  if (!opened.ok()) {
    std::printf("error: %s\n", std::string(opened.status().message()).c_str());
    return 2;
  }
  std::printf("requested: %s\nbackend: %s\nreason: %s\n", opened->choice.requested.c_str(),
              opened->choice.backend.c_str(),
              opened->choice.reason.empty() ? "(none: gds runs)" : opened->choice.reason.c_str());
  const std::string moved = RoundTrip(opened->backend.get());
  std::printf("%s moves data: %s\n", opened->choice.backend.c_str(), moved.c_str());
  std::printf("gds can move data here: %s\n",
              opened->choice.fell_back() ? "no" : moved == "yes" ? "yes" : "no");
  return 0;
}

}  // namespace
}  // namespace tutti::io

int main(int argc, char** argv) {
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "usage: gds_probe [--dir=DIR] [--library=PATH]\n");
    return 2;
  }
  return tutti::io::Probe(absl::GetFlag(FLAGS_dir), absl::GetFlag(FLAGS_library));
}
