// How fast the GPU verifier checks a Retrieve's reads as they land in host bounce slots, apart
// from any I/O: the ceiling of tuttid's path into GPU memory once reads cost nothing (an NVMe
// array DMAs into the slots; tmpfs hides this behind its CPU copies).
//
// --slots pinned host slots of --job_kib each hold random objects of --object_kib; every slot is
// one verifier batch whose objects are placed (ObjectCheck::place) at successive places of a
// device ring of --ring_mib, as layer_reader.cc does with bounce slots. A slot is handed to the
// verifier again as soon as its batch is done, so --slots batches are always in flight, for
// --seconds. The verifier runs on an I/O stream of --sm SMs (0: all SMs, no green context), as
// tuttid's check stream does, with --check_slots checks of at most --check_objects objects in
// flight (datapath.gpu_check_slots, gpu_check_batch_objects). Baseline, same run: the same pieces
// copied host -> device with cudaMemcpyAsync on one stream, --slots in flight, no checks. Every
// answer must match (a batch with a corrupted object is checked once at the start to prove
// mismatches are seen). Writes JSON lines (bench/results format) to --out and a line per figure.
// Never asserts on time.
#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/jsonl.h"
#include "common/status_macros.h"
#include "daemon/datapath/verifier.h"
#include "daemon/gpu/gpu_verifier.h"
#include "daemon/pool/slot_header.h"
#include "gpu/cuda_status.h"
#include "gpu/io_stream.h"

ABSL_FLAG(uint32_t, slots, 64, "host bounce slots, each one batch in flight");
ABSL_FLAG(uint32_t, job_kib, 1024, "bytes of one slot (one batch)");
ABSL_FLAG(uint32_t, object_kib, 32, "object size");
ABSL_FLAG(uint32_t, ring_mib, 1024, "device bytes the objects are placed in, round robin");
ABSL_FLAG(std::string, sm, "16,0", "I/O stream SM counts to run (0: all SMs, no green context)");
ABSL_FLAG(uint32_t, check_objects, 4096,
          "the most objects one check takes (gpu_check_batch_objects)");
ABSL_FLAG(std::string, check_slots, "2", "checks in flight at once to run (gpu_check_slots)");
ABSL_FLAG(double, seconds, 3, "seconds per figure");
ABSL_FLAG(std::string, out, "", "JSON lines file to append results to");
ABSL_FLAG(std::string, machine, "", "machine name for the results");

namespace tutti::bench {
namespace {

using datapath::ObjectCheck;

struct Setup {
  uint32_t slots, job_bytes, object_bytes, objects_per_job;
  uint64_t ring_bytes;
  uint8_t* host = nullptr;    // slots x job_bytes, pinned
  uint8_t* device = nullptr;  // ring_bytes
  Key key{};
  std::vector<uint64_t> expected;  // per object of a slot (slot-major)
};

// One slot's batch: its checks (places advance through the ring each time it is handed out).
struct Batch {
  std::vector<ObjectCheck> checks;
  std::vector<uint8_t> matches;
  std::vector<const uint8_t*> copies;
};

class Driver {
 public:
  Driver(const Setup& s, datapath::Verifier* v) : s_(s), v_(v), batches_(s.slots) {
    for (uint32_t i = 0; i < s.slots; ++i) {
      Batch& b = batches_[i];
      b.matches.assign(s.objects_per_job, 0);
      b.copies.assign(s.objects_per_job, nullptr);
      for (uint32_t j = 0; j < s.objects_per_job; ++j) {
        const uint64_t off = uint64_t{i} * s.job_bytes + uint64_t{j} * s.object_bytes;
        b.checks.push_back(ObjectCheck{1, &s_.key, 7, j, s.host + off, s.object_bytes,
                                       s.expected[i * s.objects_per_job + j], &b.copies[j],
                                       nullptr});
      }
    }
  }

  // Keeps every slot in flight for `seconds`; returns (GB/s, mismatches).
  std::pair<double, uint64_t> Run(double seconds) {
    const absl::Time start = absl::Now();
    const absl::Time stop = start + absl::Seconds(seconds);
    for (uint32_t i = 0; i < s_.slots; ++i) Hand(i);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return !ready_.empty(); });
      std::vector<uint32_t> ready;
      ready.swap(ready_);
      lock.unlock();
      for (uint32_t i : ready) {
        const Batch& b = batches_[i];
        for (uint32_t j = 0; j < s_.objects_per_job; ++j) {
          mismatches_ += b.matches[j] != 1 || b.copies[j] != b.checks[j].place;
        }
        bytes_ += s_.job_bytes;
        --in_flight_;
        if (absl::Now() < stop) Hand(i);
      }
      lock.lock();
      if (in_flight_ == 0) break;
    }
    return {bytes_ / absl::ToDoubleSeconds(absl::Now() - start) / 1e9, mismatches_};
  }

 private:
  void Hand(uint32_t i) {
    Batch& b = batches_[i];
    for (uint32_t j = 0; j < s_.objects_per_job; ++j) {
      b.checks[j].place = s_.device + next_place_;
      next_place_ = (next_place_ + s_.object_bytes) % s_.ring_bytes;
      b.copies[j] = nullptr;
      b.matches[j] = 0;
    }
    ++in_flight_;
    v_->Verify(1, b.checks, absl::MakeSpan(b.matches), [this, i] {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(i);
      cv_.notify_one();
    });
  }

  const Setup& s_;
  datapath::Verifier* const v_;
  std::vector<Batch> batches_;
  uint64_t next_place_ = 0, bytes_ = 0, mismatches_ = 0;
  uint32_t in_flight_ = 0;  // the driving thread's
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint32_t> ready_;
};

// The baseline: the same pieces host -> device, `slots` copies in flight on one stream.
absl::StatusOr<double> CopyOnly(const Setup& s, cudaStream_t stream, double seconds) {
  std::vector<cudaEvent_t> events(s.slots);
  for (auto& e : events) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  uint64_t place = 0, bytes = 0;
  auto post = [&](uint32_t i) -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.device + place, s.host + uint64_t{i} * s.job_bytes,
                                         s.job_bytes, cudaMemcpyHostToDevice, stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(events[i], stream));
    place = (place + s.job_bytes) % s.ring_bytes;
    return absl::OkStatus();
  };
  const absl::Time start = absl::Now();
  const absl::Time stop = start + absl::Seconds(seconds);
  for (uint32_t i = 0; i < s.slots; ++i) RETURN_IF_ERROR(post(i));
  for (uint32_t i = 0;; i = (i + 1) % s.slots) {
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events[i]));
    bytes += s.job_bytes;
    if (absl::Now() >= stop) break;
    RETURN_IF_ERROR(post(i));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const double gbps = bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
  for (auto& e : events) CUDA_RETURN_IF_ERROR(cudaEventDestroy(e));
  return gbps;
}

// A verifier that counts what the GPU one hands it (none should come: every length is supported).
class CountingFallback final : public datapath::Verifier {
 public:
  std::string_view name() const override { return "counting"; }
  void Verify(uint64_t, absl::Span<const ObjectCheck> checks, absl::Span<uint8_t> matches,
              std::function<void()> done) override {
    objects += checks.size();
    for (size_t i = 0; i < checks.size(); ++i) {
      const ObjectCheck& c = checks[i];
      matches[i] = c.len != 0 && pool::ObjectChecksum(c.ns, *c.key, c.epoch, c.object, c.bytes,
                                                      c.len) == c.expected;
    }
    done();
  }
  std::atomic<uint64_t> objects{0};
};

// The whole run; a setup error or a wrong answer is its status.
absl::Status Run(int argc, char** argv) {
  Setup s;
  s.slots = absl::GetFlag(FLAGS_slots);
  s.job_bytes = absl::GetFlag(FLAGS_job_kib) << 10;
  s.object_bytes = absl::GetFlag(FLAGS_object_kib) << 10;
  s.ring_bytes = uint64_t{absl::GetFlag(FLAGS_ring_mib)} << 20;
  if (s.slots == 0 || s.object_bytes == 0 || s.job_bytes % s.object_bytes != 0 ||
      s.ring_bytes % s.object_bytes != 0 || s.ring_bytes < uint64_t{s.slots} * s.job_bytes) {
    return absl::InvalidArgumentError("want --slots > 0, --job_kib a multiple of --object_kib, "
                                      "and a ring of whole objects holding every slot");
  }
  s.objects_per_job = s.job_bytes / s.object_bytes;
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    return absl::FailedPreconditionError("no CUDA device");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  const uint64_t host_bytes = uint64_t{s.slots} * s.job_bytes;
  CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(reinterpret_cast<void**>(&s.host), host_bytes, cudaHostAllocDefault));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&s.device), s.ring_bytes));
  std::mt19937_64 rng(11);
  for (uint64_t i = 0; i < host_bytes / 8; ++i) {
    const uint64_t r = rng();
    std::memcpy(s.host + i * 8, &r, 8);
  }
  s.key.bytes[0] = 9;
  for (uint32_t i = 0; i < s.slots; ++i) {
    for (uint32_t j = 0; j < s.objects_per_job; ++j) {
      const uint8_t* obj = s.host + uint64_t{i} * s.job_bytes + uint64_t{j} * s.object_bytes;
      s.expected.push_back(pool::ObjectChecksum(1, s.key, 7, j, obj, s.object_bytes));
    }
  }
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  const std::string machine =
      absl::GetFlag(FLAGS_machine).empty() ? prop.name : absl::GetFlag(FLAGS_machine);
  const std::string date = UtcNow(), command = CommandLine(argc, argv);
  std::ofstream out;
  if (!absl::GetFlag(FLAGS_out).empty()) out.open(absl::GetFlag(FLAGS_out), std::ios::app);
  const double seconds = absl::GetFlag(FLAGS_seconds);

  cudaStream_t copy_stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(const double copy, CopyOnly(s, copy_stream, seconds));
  std::printf("copy only: %.2f GB/s (%u slots of %u KiB, one stream)\n", copy, s.slots,
              s.job_bytes >> 10);
  int failures = 0;
  std::vector<uint32_t> check_slots;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_check_slots), ',')) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(text, &n)) {
      return absl::InvalidArgumentError(absl::StrCat("--check_slots: ", text, " is not a number"));
    }
    check_slots.push_back(n);
  }
  for (absl::string_view sm_text : absl::StrSplit(absl::GetFlag(FLAGS_sm), ',')) {
    for (const uint32_t slots : check_slots) {
      uint32_t sm = 0;
      if (!absl::SimpleAtoi(sm_text, &sm)) {
        return absl::InvalidArgumentError(absl::StrCat("--sm: ", sm_text, " is not a number"));
      }
      auto stream = gpu::IoStream::Create({0, sm, 0});
      if (!stream.ok()) {
        std::fprintf(stderr, "I/O stream of %u SMs: %s\n", sm, stream.status().ToString().c_str());
        ++failures;
        continue;
      }
      CountingFallback fallback;
      gpu::GpuVerifierOptions options;
      options.max_objects_per_slot = absl::GetFlag(FLAGS_check_objects);
      options.slots = slots;
      ASSIGN_OR_RETURN(auto v, gpu::MakeGpuVerifier(options, **stream, &fallback));
      {  // A corrupted expectation must be answered as a mismatch.
        std::vector<ObjectCheck> one = {ObjectCheck{1, &s.key, 7, 0, s.host, s.object_bytes,
                                                    s.expected[0] ^ 1, nullptr, s.device}};
        std::vector<uint8_t> match(1, 1);
        absl::Notification done;
        v->Verify(1, one, absl::MakeSpan(match), [&] { done.Notify(); });
        done.WaitForNotification();
        if (match[0] != 0) return absl::InternalError("a corrupted object was answered as a match");
      }
      Driver driver(s, v.get());
      const auto [gbps, mismatches] = driver.Run(seconds);
      v.reset();
      const bool green = (*stream)->is_green();
      std::printf(
          "verifier, %u SMs%s, %u checks of %u objects in flight: %.2f GB/s, %.3f of copy "
          "only; mismatches %lu, fallback objects %lu\n",
          sm, green ? " (green context)" : "", slots, options.max_objects_per_slot, gbps,
          gbps / copy, static_cast<unsigned long>(mismatches),
          static_cast<unsigned long>(fallback.objects.load()));
      if (mismatches != 0 || fallback.objects.load() != 0) ++failures;
      Result r{"gpu_verifier_placed_gbps",
               gbps,
               "GB/s",
               "memcpy_h2d_same_pieces",
               copy,
               absl::StrFormat("{\"sm\":%u,\"green\":%s,\"slots\":%u,\"job_kib\":%u,"
                               "\"object_kib\":%u,\"seconds\":%g,\"mismatches\":%u,"
                               "\"check_objects\":%u,\"check_slots\":%u}",
                               sm, green ? "true" : "false", s.slots, s.job_bytes >> 10,
                               s.object_bytes >> 10, seconds, mismatches,
                               options.max_objects_per_slot, slots)};
      if (out.is_open()) out << JsonLine("gpu_verifier_bench", r, machine, date, command) << "\n";
    }
  }
  CUDA_RETURN_IF_ERROR(cudaStreamDestroy(copy_stream));
  CUDA_RETURN_IF_ERROR(cudaFree(s.device));
  CUDA_RETURN_IF_ERROR(cudaFreeHost(s.host));
  if (failures > 0) {
    return absl::InternalError(absl::StrCat(failures, " figures failed (above)"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = tutti::bench::Run(argc, argv);
  if (!s.ok()) std::fprintf(stderr, "gpu_verifier_bench: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
