// What happens to the daemon when an engine whose GPU memory it has open dies while the daemon is
// writing into that memory? One scenario per run (a sticky error must not leak into the next):
//   --scenario=legacy_kill | legacy_exit | vmm_kill | vmm_exit
// legacy: the engine exports cudaIpcMemHandle_t (cudaIpcGetMemHandle / cudaIpcOpenMemHandle);
// vmm: cuMemCreate memory exported as a POSIX file descriptor, sent over a unix socket
// (SCM_RIGHTS), imported and mapped by the daemon. kill: SIGKILL; exit: the engine returns from
// main without freeing (CUDA's own teardown runs).
//
// The daemon (this process) opens two engines, A and B, runs a kernel that keeps writing A's
// memory on its green-context I/O stream, and kills A mid-kernel. Then it records: how long A
// took to exit, the kernel's result, whether A's memory is still readable through the mapping,
// whether kernels on its own memory and copies into B still work, whether a new engine C can be
// opened and written, what closing A's mapping returns, and whether the context is healthy at
// the end. JSON lines to --out (value 1 = yes / 0 = no, with CUDA's error name in "detail").
#include <cuda.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/jsonl.h"
#include "common/status_macros.h"
#include "gpu/copy_kernel.h"
#include "gpu/cuda_status.h"
#include "gpu/driver_api.h"
#include "gpu/io_stream.h"
#include "gpu/probe.h"
#include "gpu/testing/busy_kernel.h"

ABSL_FLAG(std::string, scenario, "legacy_kill", "legacy_kill | legacy_exit | vmm_kill | vmm_exit");
ABSL_FLAG(std::string, engine, "",
          "internal: run as an engine child (legacy | vmm), socket on fd 3");
ABSL_FLAG(uint32_t, engine_mib, 256, "engine allocation size");
ABSL_FLAG(uint32_t, write_ms, 1500, "how long the daemon's kernel writes the victim's memory");
ABSL_FLAG(uint32_t, kill_after_ms, 300, "when the victim dies, after the kernel starts");
ABSL_FLAG(std::string, out, "", "JSON lines file to append results to");
ABSL_FLAG(std::string, machine, "", "machine name for the results");

namespace tutti::bench {
namespace {

constexpr int kSocketFd = 3;
const char* Name(cudaError_t e) { return cudaGetErrorName(e); }

const gpu::DriverApi& Api() { return **gpu::GetDriverApi(); }

// ---- engine child ----

CUmemAllocationProp VmmProp() {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

bool MapVmm(CUmemGenericAllocationHandle h, size_t size, CUdeviceptr* ptr) {
  if (Api().MemAddressReserve(ptr, size, 0, 0, 0) != CUDA_SUCCESS) return false;
  if (Api().MemMap(*ptr, size, 0, h, 0) != CUDA_SUCCESS) return false;
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return Api().MemSetAccess(*ptr, size, &access, 1) == CUDA_SUCCESS;
}

int EngineMain(const std::string& mode) {
  uint64_t size = uint64_t{absl::GetFlag(FLAGS_engine_mib)} << 20;
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) return 2;
  void* mem = nullptr;
  if (mode == "legacy") {
    cudaIpcMemHandle_t h;
    if (cudaMalloc(&mem, size) != cudaSuccess || cudaMemset(mem, 0x11, size) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess || cudaIpcGetMemHandle(&h, mem) != cudaSuccess) {
      return 3;
    }
    if (write(kSocketFd, &size, 8) != 8 || write(kSocketFd, &h, sizeof(h)) != sizeof(h)) return 4;
  } else {
    CUmemAllocationProp prop = VmmProp();
    size_t gran = 0;
    Api().MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    size = (size + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    CUdeviceptr ptr;
    int fd = -1;
    if (Api().MemCreate(&h, size, &prop, 0) != CUDA_SUCCESS || !MapVmm(h, size, &ptr) ||
        cudaMemset(reinterpret_cast<void*>(ptr), 0x11, size) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess ||
        Api().MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
            CUDA_SUCCESS) {
      return 3;
    }
    char control[CMSG_SPACE(sizeof(int))] = {};
    iovec iov = {&size, 8};
    msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    if (sendmsg(kSocketFd, &msg, 0) != 8) return 4;
  }
  char cmd = 0;
  if (read(kSocketFd, &cmd, 1) == 1 && cmd == 'q' && mem != nullptr) cudaFree(mem);
  return 0;  // 'x', 'q' or EOF: return without freeing (CUDA's teardown runs)
}

// ---- daemon side ----

struct Engine {
  pid_t pid = -1;
  int sock = -1;
  bool vmm = false;
  uint8_t* ptr = nullptr;
  size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  cudaIpcMemHandle_t legacy{};  // legacy: as received
  int fd = -1;                  // vmm: as received, until imported
};

// Starts an engine child and receives its export (a legacy handle, or a file descriptor).
absl::Status Spawn(bool vmm, Engine* e) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError("socketpair");
  }
  e->vmm = vmm;
  e->pid = fork();
  if (e->pid == 0) {
    dup2(sv[1], kSocketFd);
    const std::string engine = absl::StrCat("--engine=", vmm ? "vmm" : "legacy");
    const std::string mib = absl::StrCat("--engine_mib=", absl::GetFlag(FLAGS_engine_mib));
    char* argv[] = {const_cast<char*>("/proc/self/exe"), const_cast<char*>(engine.c_str()),
                    const_cast<char*>(mib.c_str()), nullptr};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(sv[1]);
  e->sock = sv[0];
  uint64_t size = 0;
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov = {&size, 8};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (recvmsg(e->sock, &msg, MSG_WAITALL) != 8) return absl::InternalError("engine did not report");
  e->size = size;
  if (!vmm) {
    if (read(e->sock, &e->legacy, sizeof(e->legacy)) != sizeof(e->legacy)) {
      return absl::InternalError("no handle");
    }
    return absl::OkStatus();
  }
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return absl::InternalError("no fd");
  std::memcpy(&e->fd, CMSG_DATA(c), sizeof(int));
  return absl::OkStatus();
}

// Opens (legacy) or imports and maps (vmm) what Spawn received.
absl::Status Import(Engine* e) {
  if (!e->vmm) {
    void* p = nullptr;
    RETURN_IF_ERROR(
        gpu::CudaStatus(cudaIpcOpenMemHandle(&p, e->legacy, cudaIpcMemLazyEnablePeerAccess),
                        "cudaIpcOpenMemHandle"));
    e->ptr = static_cast<uint8_t*>(p);
    return absl::OkStatus();
  }
  CUresult r = Api().MemImportFromShareableHandle(
      &e->handle, reinterpret_cast<void*>(static_cast<uintptr_t>(e->fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(e->fd);
  e->fd = -1;
  RETURN_IF_ERROR(gpu::CuStatus(r, "cuMemImportFromShareableHandle"));
  CUdeviceptr ptr;
  if (!MapVmm(e->handle, e->size, &ptr)) return absl::InternalError("map imported memory");
  e->ptr = reinterpret_cast<uint8_t*>(ptr);
  return absl::OkStatus();
}

absl::Status SpawnAndImport(bool vmm, Engine* e) {
  RETURN_IF_ERROR(Spawn(vmm, e));
  return Import(e);
}

double FreeMib() {
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  return free_bytes / 1048576.0;
}

// Closes the daemon's mapping; returns the first error's name, or "cudaSuccess".
std::string Release(Engine* e) {
  if (!e->vmm) return Name(cudaIpcCloseMemHandle(e->ptr));
  const char* name = nullptr;
  CUresult r = Api().MemUnmap(reinterpret_cast<CUdeviceptr>(e->ptr), e->size);
  if (r == CUDA_SUCCESS) r = Api().MemAddressFree(reinterpret_cast<CUdeviceptr>(e->ptr), e->size);
  if (r == CUDA_SUCCESS) r = Api().MemRelease(e->handle);
  Api().GetErrorName(r, &name);
  return name ? name : "?";
}

void Finish(Engine* e) {
  char q = 'q';
  if (write(e->sock, &q, 1) != 1) kill(e->pid, SIGKILL);
  waitpid(e->pid, nullptr, 0);
  close(e->sock);
}

struct Record {
  std::string metric;
  double value;
  std::string unit;
  std::string detail;
};

// Copies `bytes` from src to dst with the copy kernel on `io`, then reads 4 KiB of dst back and
// checks it equals the first 4 KiB of src. Returns the error name or "ok"/"mismatch".
std::string CopyAndCheck(gpu::IoStream& io, const uint8_t* src, uint8_t* dst, size_t bytes) {
  std::vector<gpu::CopyDesc> descs;
  for (size_t off = 0; off < bytes; off += 32768) descs.push_back({src + off, dst + off});
  cudaError_t e = gpu::LaunchCopyObjects(descs.data(), descs.size(), 32768, io.ctas(), io.stream());
  if (e == cudaSuccess) e = cudaStreamSynchronize(io.stream());
  if (e != cudaSuccess) return Name(e);
  std::vector<uint8_t> a(4096), b(4096);
  if ((e = cudaMemcpy(a.data(), src, 4096, cudaMemcpyDeviceToHost)) != cudaSuccess) return Name(e);
  if ((e = cudaMemcpy(b.data(), dst, 4096, cudaMemcpyDeviceToHost)) != cudaSuccess) return Name(e);
  return a == b ? "ok" : "mismatch";
}

absl::Status RunScenario(const std::string& scenario, std::vector<Record>* out) {
  const bool vmm = scenario.rfind("vmm", 0) == 0;
  const bool kill_it = scenario.find("kill") != std::string::npos;
  ASSIGN_OR_RETURN(auto io, gpu::IoStream::Create({0, 16, 0}));
  out->push_back({"io_stream_green", io->is_green() ? 1.0 : 0.0, "bool", io->description()});
  const size_t bytes = uint64_t{absl::GetFlag(FLAGS_engine_mib)} << 20;
  uint8_t *own_src = nullptr, *own_dst = nullptr;
  RETURN_IF_ERROR(gpu::CudaStatus(cudaMalloc(&own_src, bytes), "cudaMalloc"));
  RETURN_IF_ERROR(gpu::CudaStatus(cudaMalloc(&own_dst, bytes), "cudaMalloc"));
  RETURN_IF_ERROR(gpu::CudaStatus(cudaMemset(own_src, 0x22, bytes), "cudaMemset"));
  Engine a, b, c;
  RETURN_IF_ERROR(SpawnAndImport(vmm, &a));
  RETURN_IF_ERROR(SpawnAndImport(vmm, &b));
  const double free_before = FreeMib();

  // The victim dies while our kernel writes its memory.
  const uint64_t write_ns = uint64_t{absl::GetFlag(FLAGS_write_ms)} * 1000000;
  RETURN_IF_ERROR(gpu::CudaStatus(
      gpu::testing::LaunchWriteFor(a.ptr, bytes, write_ns, io->ctas(), io->stream()), "launch"));
  std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_kill_after_ms)));
  const bool running_at_death = cudaStreamQuery(io->stream()) == cudaErrorNotReady;
  const auto t0 = std::chrono::steady_clock::now();
  if (kill_it) {
    kill(a.pid, SIGKILL);
  } else {
    char x = 'x';
    (void)!write(a.sock, &x, 1);
  }
  int wstatus = 0;
  waitpid(a.pid, &wstatus, 0);
  const double exit_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const bool running_after_exit = cudaStreamQuery(io->stream()) == cudaErrorNotReady;
  const double free_after_death = FreeMib();
  out->push_back({"kernel_running_when_engine_died", running_at_death ? 1.0 : 0.0, "bool", ""});
  out->push_back(
      {"engine_exit_latency", exit_ms, "ms",
       absl::StrCat("wait status ", wstatus,
                    running_after_exit ? "; daemon kernel still running after the engine was gone"
                                       : "; daemon kernel had finished")});
  cudaError_t e = cudaStreamSynchronize(io->stream());
  out->push_back(
      {"inflight_kernel_into_dead_engine_ok", e == cudaSuccess ? 1.0 : 0.0, "bool", Name(e)});
  e = cudaGetLastError();
  out->push_back({"no_error_pending_after", e == cudaSuccess ? 1.0 : 0.0, "bool", Name(e)});
  uint32_t word[4] = {0, 0, 0, 0};
  e = cudaMemcpy(word, a.ptr, sizeof(word), cudaMemcpyDeviceToHost);
  out->push_back(
      {"dead_engine_memory_readable", e == cudaSuccess ? 1.0 : 0.0, "bool",
       absl::StrCat(Name(e), "; first word = pass ", word[0], ", tag ", absl::Hex(word[2]))});
  std::string r = CopyAndCheck(*io, own_src, own_dst, bytes);
  out->push_back({"own_memory_kernel_ok", r == "ok" ? 1.0 : 0.0, "bool", r});
  r = CopyAndCheck(*io, own_src, b.ptr, bytes);
  out->push_back({"other_engine_copy_ok", r == "ok" ? 1.0 : 0.0, "bool", r});
  absl::Status s = SpawnAndImport(vmm, &c);
  r = s.ok() ? CopyAndCheck(*io, own_src, c.ptr, bytes) : s.ToString();
  out->push_back({"new_engine_open_and_copy_ok", r == "ok" ? 1.0 : 0.0, "bool", r});
  r = Release(&a);
  out->push_back({"close_dead_engine_mapping_ok",
                  r == "cudaSuccess" || r == "CUDA_SUCCESS" ? 1.0 : 0.0, "bool", r});
  const double free_after_close = FreeMib();
  out->push_back(
      {"gpu_free_memory_change_at_engine_death", free_after_death - free_before, "MiB",
       absl::StrCat("engine allocation ", bytes >> 20, " MiB; device-wide free memory")});
  out->push_back({"gpu_free_memory_change_at_daemon_close", free_after_close - free_after_death,
                  "MiB", "after the daemon closed the dead engine's mapping"});
  r = Release(&b);
  out->push_back({"close_other_engine_mapping_ok",
                  r == "cudaSuccess" || r == "CUDA_SUCCESS" ? 1.0 : 0.0, "bool", r});
  if (s.ok()) Release(&c);
  Finish(&b);
  if (s.ok()) Finish(&c);

  // An export whose exporter died before the daemon opened it (a stale handle / fd).
  Engine d;
  s = Spawn(vmm, &d);
  if (s.ok()) {
    kill(d.pid, SIGKILL);
    waitpid(d.pid, nullptr, 0);
    close(d.sock);
    s = Import(&d);
    r = s.ok() ? CopyAndCheck(*io, own_src, d.ptr, bytes) : s.ToString();
    if (s.ok()) Release(&d);
  } else {
    r = s.ToString();
  }
  out->push_back({"open_after_exporter_died_ok", r == "ok" ? 1.0 : 0.0, "bool", r});
  e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemset(own_dst, 0, 4096);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  out->push_back({"context_healthy_at_end", e == cudaSuccess ? 1.0 : 0.0, "bool", Name(e)});
  return absl::OkStatus();
}

void Report(const std::string& scenario, const std::vector<Record>& records,
            const std::string& command) {
  std::string machine = absl::GetFlag(FLAGS_machine);
  if (machine.empty()) {
    auto dev = gpu::Probe(0);
    int driver = 0;
    cudaDriverGetVersion(&driver);
    machine = absl::StrCat(dev.ok() ? dev->name : "?", ", CUDA driver ", driver);
  }
  const std::string date = tutti::bench::UtcNow();
  std::ofstream out;
  if (!absl::GetFlag(FLAGS_out).empty()) out.open(absl::GetFlag(FLAGS_out), std::ios::app);
  for (const Record& r : records) {
    std::printf("%-12s %-40s %10.2f %-5s %s\n", scenario.c_str(), r.metric.c_str(), r.value,
                r.unit.c_str(), r.detail.c_str());
    if (!out.is_open()) continue;
    Result line{scenario + "." + r.metric, r.value, r.unit};  // no baseline: an experiment
    line.detail = r.detail;
    out << JsonLine("gpu_owner_death", line, machine, date, command) << "\n";
  }
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_engine).empty()) {
    if (!tutti::gpu::GetDriverApi().ok()) return 2;
    return tutti::bench::EngineMain(absl::GetFlag(FLAGS_engine));
  }
  signal(SIGPIPE, SIG_IGN);
  alarm(120);  // never hang the device run
  auto probe = tutti::gpu::Probe(0);
  if (!probe.ok()) {
    std::fprintf(stderr, "gpu_owner_death: %s\n", probe.status().ToString().c_str());
    return 1;
  }
  if (!tutti::gpu::GetDriverApi().ok() || (absl::GetFlag(FLAGS_scenario).rfind("vmm", 0) == 0 &&
                                           !(*tutti::gpu::GetDriverApi())->has_vmm())) {
    std::fprintf(stderr, "gpu_owner_death: driver lacks what the scenario needs\n");
    return 1;
  }
  std::vector<tutti::bench::Record> records;
  absl::Status s = tutti::bench::RunScenario(absl::GetFlag(FLAGS_scenario), &records);
  tutti::bench::Report(absl::GetFlag(FLAGS_scenario), records, command);
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_owner_death: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
