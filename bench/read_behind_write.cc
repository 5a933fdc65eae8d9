// read_behind_write: how long a small read waits when it is posted to a pool file's ring while a
// large write to the same file is in flight, through the "uring" I/O backend. Each trial posts one
// write of --write_mib, waits --gap_ms (the ring's owner is then waiting in the kernel), posts one
// read of --read_kib elsewhere in the file, and times both from their post to their completion.
// The baseline, in the same run: the same read with nothing else in flight.
//
//   bazel build //bench:read_behind_write
//   bazel-bin/bench/read_behind_write --dir=/var/tmp/rbw
//   --out=bench/results/read_behind_write.jsonl
//
// The file lives on --dir's filesystem, opened O_DIRECT. On tmpfs a large write is one long copy
// on an io_uring worker, and the read another worker's short one; a disk may itself serve the read
// after the write's pieces (the build machine's virtio disk does), whatever the ring does.
// Prints a table; with --out, appends JSON lines (bench/jsonl.h). Never asserts on time.
#include <fcntl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "bench/jsonl.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/uring_backend.h"

ABSL_FLAG(std::string, dir, "/var/tmp/tutti-read-behind-write", "directory for the test file");
ABSL_FLAG(uint32_t, write_mib, 16, "bytes of the write in flight, MiB");
ABSL_FLAG(uint32_t, read_kib, 32, "bytes of the read posted behind it, KiB");
ABSL_FLAG(uint32_t, gap_ms, 1, "from the write's post to the read's");
ABSL_FLAG(uint32_t, trials, 20, "trials of each kind (the median counts)");
ABSL_FLAG(std::string, out, "", "append JSON lines here");
ABSL_FLAG(std::string, label, "", "written as the lines' label");

namespace tutti::bench {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string Machine() {
  utsname u;
  uname(&u);
  return absl::StrCat(u.nodename, " (", std::thread::hardware_concurrency(), " cores, ", u.release,
                      ")");
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One request posted alone; its latency from now to its completion is set on `ms`.
struct Timed {
  io::IoRequest req;
  absl::Notification done;
  double ms = 0;
  void Post(io::IoBackend* b) {
    const Clock::time_point t0 = Clock::now();
    b->Submit(absl::MakeSpan(&req, 1), [this, t0] {
      ms = MsSince(t0);
      done.Notify();
    });
  }
};

int Run(int argc, char** argv) {
  const uint64_t write_bytes = uint64_t{absl::GetFlag(FLAGS_write_mib)} << 20;
  const uint32_t read_bytes = absl::GetFlag(FLAGS_read_kib) << 10;
  const uint64_t read_area = 64ull << 20;  // reads land after the write's extent, in this span
  const uint64_t file_bytes = write_bytes + read_area;
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/file";
  {
    // Written once, so that reads hit written extents.
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    std::vector<char> chunk(1 << 20, 'a');
    for (uint64_t off = 0; off < file_bytes; off += chunk.size())
      f.write(chunk.data(), chunk.size());
    if (!f) {
      std::fprintf(stderr, "read_behind_write: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  const int fd = open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "read_behind_write: open %s with O_DIRECT: %s\n", path.c_str(),
                 std::strerror(errno));
    return 1;
  }
  io::UringOptions options;
  absl::StatusOr<std::unique_ptr<io::UringBackend>> backend =
      io::UringBackend::Create({fd}, options);
  if (!backend.ok()) {
    std::fprintf(stderr, "read_behind_write: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  io::AlignedBuffer wbuf(write_bytes), rbuf(read_bytes);
  std::memset(wbuf.data(), 'b', write_bytes);
  std::mt19937_64 rng(1);
  auto read_offset = [&] {
    return write_bytes + (rng() % ((read_area - read_bytes) / 4096)) * 4096;
  };
  std::vector<double> alone, behind, writes;
  for (uint32_t t = 0; t < absl::GetFlag(FLAGS_trials); ++t) {
    Timed r0;
    r0.req = io::IoRequest{io::Op::kRead, 0, read_offset(), rbuf.data(), read_bytes};
    r0.Post(backend->get());
    r0.done.WaitForNotification();
    alone.push_back(r0.ms);

    Timed w, r;
    w.req = io::IoRequest{io::Op::kWrite, 0, 0, wbuf.data(), static_cast<uint32_t>(write_bytes)};
    r.req = io::IoRequest{io::Op::kRead, 0, read_offset(), rbuf.data(), read_bytes};
    w.Post(backend->get());
    std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_gap_ms)));
    r.Post(backend->get());
    r.done.WaitForNotification();
    w.done.WaitForNotification();
    if (r.req.result != read_bytes || w.req.result != static_cast<int64_t>(write_bytes)) {
      std::fprintf(stderr, "read_behind_write: a request failed (read %lld, write %lld)\n",
                   static_cast<long long>(r.req.result), static_cast<long long>(w.req.result));
      return 1;
    }
    behind.push_back(r.ms);
    writes.push_back(w.ms);
  }
  const double m_alone = Median(alone), m_behind = Median(behind), m_write = Median(writes);
  std::printf("%-34s %10s\n", "median over trials", "ms");
  std::printf("%-34s %10.3f\n", "read alone", m_alone);
  std::printf("%-34s %10.3f\n", "read posted behind the write", m_behind);
  std::printf("%-34s %10.3f\n", "the write", m_write);
  if (!absl::GetFlag(FLAGS_out).empty()) {
    const std::string detail = absl::StrCat(
        "label=", absl::GetFlag(FLAGS_label), " write_ms=", m_write,
        " write_mib=", absl::GetFlag(FLAGS_write_mib), " read_kib=", absl::GetFlag(FLAGS_read_kib),
        " gap_ms=", absl::GetFlag(FLAGS_gap_ms), " trials=", absl::GetFlag(FLAGS_trials));
    Result res{"read_behind_write_ms", m_behind, "ms", "read_alone_ms", m_alone, detail};
    std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::app);
    out << JsonLine("read_behind_write", res, Machine(), UtcNow(), CommandLine(argc, argv)) << "\n";
  }
  backend->reset();
  std::filesystem::remove(path);
  return 0;
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tutti::bench::Run(argc, argv);
}
