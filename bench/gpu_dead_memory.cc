// Is a dead engine's GPU memory freed while the daemon still maps it, and can the daemon's late
// writes then land in another process's memory? (docs/gpu.md's open question, measured cleanly.)
//
// This process is the daemon. Engine A (a child) allocates --engine_gib GiB, fills it, and hands
// over a legacy IPC handle; the daemon opens it. Free device memory is read before A dies and
// after (no other process starts in between). Then process C allocates nearly all free memory and
// fills it with known content; the daemon writes every byte of A's mapping (cudaMemset on its
// stream); C counts the words of its memory that changed. Last, the daemon closes the mapping
// and reads free memory again. JSON lines to --out.
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/jsonl.h"
#include "tests/gpu/content_kernel.h"

ABSL_FLAG(std::string, role, "", "internal: engine | grabber");
ABSL_FLAG(uint32_t, engine_gib, 4, "engine A's allocation");
ABSL_FLAG(std::string, out, "", "JSON lines file to append to");
ABSL_FLAG(std::string, machine, "", "machine description");

namespace tutti::bench {
namespace {

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kChunk = 1ull << 30;  // the grabber's allocations
constexpr uint32_t kObject = 64u << 20;  // its content objects

double FreeGiB() {
  size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  return free / double(kGiB);
}

int EngineMain() {
  void* p = nullptr;
  const uint64_t bytes = uint64_t{absl::GetFlag(FLAGS_engine_gib)} * kGiB;
  if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemset(p, 0x11, bytes) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    return 2;
  }
  cudaIpcMemHandle_t h;
  if (cudaIpcGetMemHandle(&h, p) != cudaSuccess) return 3;
  fwrite(&h, sizeof(h), 1, stdout);
  fflush(stdout);
  pause();
  return 0;
}

// Allocates up to the size on stdin (GiB), fills it, says "ready <GiB>", waits for a line, and
// prints the number of changed 8-byte words.
int GrabberMain() {
  double want = 0;
  if (scanf("%lf", &want) != 1) return 2;
  std::vector<void*> chunks;
  std::vector<gputest::ObjectRef> refs;
  while (chunks.size() * kChunk / double(kGiB) + 1 <= want) {
    void* p = nullptr;
    if (cudaMalloc(&p, kChunk) != cudaSuccess) break;
    chunks.push_back(p);
    for (uint64_t off = 0; off < kChunk; off += kObject) {
      refs.push_back({static_cast<uint8_t*>(p) + off, refs.size()});
    }
  }
  (void)cudaGetLastError();
  gputest::ObjectRef* d_refs = nullptr;
  unsigned long long* d_count = nullptr;
  cudaMalloc(&d_refs, refs.size() * sizeof(refs[0]));
  cudaMalloc(&d_count, 8);
  cudaMemcpy(d_refs, refs.data(), refs.size() * sizeof(refs[0]), cudaMemcpyHostToDevice);
  cudaMemset(d_count, 0, 8);
  gputest::LaunchFillObjects(d_refs, refs.size(), kObject, 42, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) return 3;
  printf("ready %zu\n", chunks.size());
  fflush(stdout);
  char line[16];
  if (scanf("%15s", line) != 1) return 4;
  gputest::LaunchCountMismatches(d_refs, refs.size(), kObject, 42, d_count, nullptr);
  unsigned long long changed = 0;
  cudaMemcpy(&changed, d_count, 8, cudaMemcpyDeviceToHost);
  printf("changed %llu\n", changed);
  fflush(stdout);
  return 0;
}

struct Child {
  pid_t pid;
  FILE* to;
  FILE* from;
};

Child Spawn(const char* role) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) abort();
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    const std::string flag = absl::StrCat("--role=", role);
    const std::string gib = absl::StrCat("--engine_gib=", absl::GetFlag(FLAGS_engine_gib));
    execl("/proc/self/exe", "/proc/self/exe", flag.c_str(), gib.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  return {pid, fdopen(in[1], "w"), fdopen(out[0], "r")};
}

struct Record {
  std::string metric;
  double value;
  std::string unit, detail;
};

int DaemonMain(std::vector<Record>* rec) {
  Child a = Spawn("engine");
  cudaIpcMemHandle_t h;
  if (fread(&h, sizeof(h), 1, a.from) != 1) return 2;
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  void* mapped = nullptr;
  if (cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) return 3;
  const uint64_t bytes = uint64_t{absl::GetFlag(FLAGS_engine_gib)} * kGiB;
  uint8_t first = 0;
  cudaMemcpy(&first, mapped, 1, cudaMemcpyDeviceToHost);
  const double free_alive = FreeGiB();
  kill(a.pid, SIGKILL);
  waitpid(a.pid, nullptr, 0);
  absl::SleepFor(absl::Milliseconds(300));
  const double free_dead = FreeGiB();
  rec->push_back({"engine_alive_first_byte", double(first), "", "0x11 expected"});
  rec->push_back({"free_gib_engine_alive_mapped", free_alive, "GiB", ""});
  rec->push_back({"free_gib_engine_dead_still_mapped", free_dead, "GiB",
                  absl::StrCat("engine allocation ", bytes / kGiB, " GiB")});
  Child c = Spawn("grabber");
  fprintf(c.to, "%f\n", free_dead - 1.0);
  fflush(c.to);
  size_t grabbed = 0;
  if (fscanf(c.from, " ready %zu", &grabbed) != 1) return 4;
  rec->push_back({"grabber_allocated_gib", double(grabbed), "GiB", ""});
  const cudaError_t w = cudaMemsetAsync(mapped, 0x77, bytes, s);
  const cudaError_t ws = cudaStreamSynchronize(s);
  rec->push_back({"late_write_into_dead_mapping_ok",
                  (ws == cudaSuccess && w == cudaSuccess) ? 1.0 : 0.0, "",
                  cudaGetErrorName(ws != cudaSuccess ? ws : w)});
  fprintf(c.to, "check\n");
  fflush(c.to);
  unsigned long long changed = 0;
  if (fscanf(c.from, " changed %llu", &changed) != 1) return 5;
  rec->push_back({"grabber_words_changed_by_late_write", double(changed), "words",
                  "8-byte words of the third process's memory that the daemon's write changed"});
  fclose(c.to);
  waitpid(c.pid, nullptr, 0);
  const cudaError_t closed = cudaIpcCloseMemHandle(mapped);
  absl::SleepFor(absl::Milliseconds(200));
  rec->push_back({"close_dead_mapping_ok", closed == cudaSuccess ? 1.0 : 0.0, "", cudaGetErrorName(closed)});
  rec->push_back({"free_gib_after_close", FreeGiB(), "GiB", ""});
  rec->push_back({"daemon_context_healthy", cudaDeviceSynchronize() == cudaSuccess ? 1.0 : 0.0, "", ""});
  return 0;
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "engine") return tutti::bench::EngineMain();
  if (role == "grabber") return tutti::bench::GrabberMain();
  alarm(120);
  std::vector<tutti::bench::Record> rec;
  const int rc = tutti::bench::DaemonMain(&rec);
  const std::string date = tutti::bench::UtcNow();
  std::ofstream out;
  if (!absl::GetFlag(FLAGS_out).empty()) out.open(absl::GetFlag(FLAGS_out), std::ios::app);
  for (const auto& r : rec) {
    std::printf("%-40s %10.3f %-5s %s\n", r.metric.c_str(), r.value, r.unit.c_str(),
                r.detail.c_str());
    if (!out.is_open()) continue;
    tutti::bench::Result line{r.metric, r.value, r.unit};  // no baseline: an experiment
    line.detail = r.detail;
    out << tutti::bench::JsonLine("gpu_dead_memory", line, absl::GetFlag(FLAGS_machine), date,
                                  command)
        << "\n";
  }
  if (rc != 0) std::fprintf(stderr, "gpu_dead_memory: failed at step %d\n", rc);
  return rc;
}
