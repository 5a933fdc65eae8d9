// The GPU hash kernel against libxxhash, and the GPU verifier against the CPU's answers: good
// objects match, corrupted ones and failed reads do not, lengths the kernel does not take and
// batches larger than a slot go to the fallback, concurrent batches each finish once, and
// VerifyReleasing gives the host bytes back once they are copied.
#include "daemon/gpu/gpu_verifier.h"

#include <cuda_runtime.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_generateSecret_fromSeed
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/pool/slot_header.h"
#include "gpu/hash_kernel.h"
#include "gpu/io_stream.h"
#include "gpu/testing/busy_kernel.h"
#include "gpu/testing/test_util.h"
#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

using datapath::ObjectCheck;

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(HashKernelTest, EqualsXxh3WithSeedForEverySupportedShape) {
  TUTTI_SKIP_WITHOUT_GPU();
  const uint32_t lens[] = {256, 320, 960, 1024, 1088, 2048, 4096, 31744, 32768, 33792, 65536,
                           kMaxGpuHashLen};
  const uint64_t seeds[] = {0, 1, 0x9E3779B97F4A7C15ull, ~0ull};
  Xxh3Secret secret;
  XXH3_generateSecret_fromSeed(secret.bytes, 0);
  std::vector<HashDesc> descs;
  std::vector<uint64_t> want;
  std::vector<void*> buffers;
  uint64_t n = 0;
  for (uint32_t len : lens) {
    ASSERT_TRUE(GpuHashSupports(len)) << len;
    for (uint64_t seed : seeds) {
      const std::vector<uint8_t> data = RandomBytes(len, ++n);
      void* d = nullptr;
      ASSERT_EQ(cudaMalloc(&d, len), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d, data.data(), len, cudaMemcpyHostToDevice), cudaSuccess);
      buffers.push_back(d);
      descs.push_back(HashDesc{d, seed, len});
      want.push_back(XXH3_64bits_withSeed(data.data(), len, seed));
    }
  }
  HashDesc* descs_dev = nullptr;
  uint64_t* hashes_dev = nullptr;
  ASSERT_EQ(cudaMalloc(&descs_dev, descs.size() * sizeof(HashDesc)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&hashes_dev, descs.size() * sizeof(uint64_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(descs_dev, descs.data(), descs.size() * sizeof(HashDesc),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(LaunchHashObjects(descs_dev, static_cast<uint32_t>(descs.size()), secret, hashes_dev,
                              nullptr),
            cudaSuccess);
  std::vector<uint64_t> got(descs.size());
  ASSERT_EQ(cudaMemcpy(got.data(), hashes_dev, got.size() * sizeof(uint64_t),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "len " << descs[i].len << " seed " << descs[i].seed;
  }
  for (void* b : buffers) cudaFree(b);
  cudaFree(descs_dev);
  cudaFree(hashes_dev);
  EXPECT_FALSE(GpuHashSupports(240));
  EXPECT_FALSE(GpuHashSupports(4000));
  EXPECT_FALSE(GpuHashSupports(kMaxGpuHashLen + 64));
}

// Counts what reaches the CPU fallback.
class CountingVerifier final : public datapath::Verifier {
 public:
  std::string_view name() const override { return "counting-cpu"; }
  void Verify(uint64_t stream, absl::Span<const ObjectCheck> checks, absl::Span<uint8_t> matches,
              std::function<void()> done) override {
    objects += checks.size();
    cpu_->Verify(stream, checks, matches, std::move(done));
  }
  std::atomic<uint64_t> objects{0};

 private:
  std::unique_ptr<datapath::Verifier> cpu_ = datapath::MakeCpuVerifier(nullptr);
};

struct Staging {
  explicit Staging(size_t bytes) : size(bytes) {
    EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&data), bytes, cudaHostAllocDefault),
              cudaSuccess);
  }
  ~Staging() { cudaFreeHost(data); }
  uint8_t* data = nullptr;
  size_t size;
};

// Checks of `n` objects of `len` bytes laid out back to back in host `bytes`, each placed at the
// same offset of `device`, its device copy reported into (*copies)[i].
std::vector<ObjectCheck> PlacedChecks(uint32_t ns, const Key& key, uint64_t epoch, uint8_t* bytes,
                                      uint8_t* device, uint32_t n, uint32_t len,
                                      std::vector<const uint8_t*>* copies) {
  copies->assign(n, nullptr);
  std::vector<ObjectCheck> checks;
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t* obj = bytes + uint64_t{i} * len;
    checks.push_back(ObjectCheck{ns, &key, epoch, i, obj, len,
                                 pool::ObjectChecksum(ns, key, epoch, i, obj, len), &(*copies)[i],
                                 device + uint64_t{i} * len});
  }
  return checks;
}

// Every object but `mismatch` matched and was placed, holding `want`'s bytes at its offset.
void ExpectPlaced(const std::vector<ObjectCheck>& checks, const std::vector<uint8_t>& matches,
                  const std::vector<const uint8_t*>& copies, const std::vector<uint8_t>& want,
                  int64_t mismatch = -1) {
  std::vector<uint8_t> back;
  for (size_t i = 0; i < checks.size(); ++i) {
    const uint32_t len = checks[i].len;
    EXPECT_EQ(matches[i],
              static_cast<int64_t>(i) == mismatch ? datapath::kMismatch : datapath::kMatch)
        << "object " << i;
    if (static_cast<int64_t>(i) == mismatch) continue;
    ASSERT_EQ(copies[i], checks[i].place) << "object " << i;
    back.resize(len);
    ASSERT_EQ(cudaMemcpy(back.data(), copies[i], len, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(back.data(), want.data() + i * len, len), 0) << i;
  }
}

TEST(GpuVerifierTest, AnswersAsTheChecksumsSay) {
  TUTTI_SKIP_WITHOUT_GPU();
  auto stream = IoStream::Create({0, 0, 0});
  ASSERT_TRUE(stream.ok()) << stream.status();
  CountingVerifier fallback;
  GpuVerifierOptions options;
  options.slot_bytes = 1 << 20;  // 32 objects of 32 KiB: batches below fill several slots
  options.max_objects_per_slot = 64;
  auto v = MakeGpuVerifier(options, **stream, &fallback);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)->name(), "gpu");

  constexpr uint32_t kLen = 32768, kBatches = 24, kPerBatch = 16;
  Staging staging(uint64_t{kLen} * kBatches * kPerBatch);
  const std::vector<uint8_t> bytes = RandomBytes(staging.size, 7);
  std::memcpy(staging.data, bytes.data(), staging.size);
  Key key{};
  key.bytes[0] = 42;
  std::vector<ObjectCheck> checks(kBatches * kPerBatch);
  std::vector<uint8_t> want(checks.size());
  for (uint32_t i = 0; i < checks.size(); ++i) {
    uint8_t* obj = staging.data + uint64_t{i} * kLen;
    ObjectCheck c{3, &key, 9, i, obj, kLen, pool::ObjectChecksum(3, key, 9, i, obj, kLen)};
    want[i] = 1;
    if (i % 7 == 3) {  // corrupted after it was written: one bit
      obj[i % kLen] ^= 0x10;
      want[i] = 0;
    } else if (i % 11 == 5) {  // another object's identity
      c.object = i + 1;
      want[i] = 0;
    } else if (i % 13 == 6) {  // a failed read: not hashed, never a match
      c.len = 0;
      want[i] = 0;
    }
    checks[i] = c;
  }
  std::vector<uint8_t> matches(checks.size(), 2);
  std::vector<std::atomic<int>> done(kBatches);
  absl::Notification all;
  std::atomic<uint32_t> left{kBatches};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t b = t; b < kBatches; b += 4) {
        (*v)->Verify(/*stream=*/t + 1,
                     absl::MakeConstSpan(checks).subspan(b * kPerBatch, kPerBatch),
                     absl::MakeSpan(matches).subspan(b * kPerBatch, kPerBatch), [&, b] {
                       done[b].fetch_add(1);
                       if (left.fetch_sub(1) == 1) all.Notify();
                     });
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(30)));
  for (uint32_t b = 0; b < kBatches; ++b) EXPECT_EQ(done[b].load(), 1) << "batch " << b;
  for (size_t i = 0; i < checks.size(); ++i) EXPECT_EQ(matches[i], want[i]) << "object " << i;
  EXPECT_EQ(fallback.objects.load(), 0u) << "every batch fits a slot and every length is taken";

  // A length the kernel does not take, and a batch larger than a slot, go to the fallback.
  std::vector<ObjectCheck> odd = {checks[0]};
  odd[0].len = 4000;
  odd[0].expected = pool::ObjectChecksum(3, key, 9, 0, odd[0].bytes, 4000);
  std::vector<uint8_t> odd_match(1, 2);
  absl::Notification odd_done;
  (*v)->Verify(1, odd, absl::MakeSpan(odd_match), [&] { odd_done.Notify(); });
  ASSERT_TRUE(odd_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(odd_match[0], 1);
  std::vector<uint8_t> big_match(48, 2);
  absl::Notification big_done;
  (*v)->Verify(1, absl::MakeConstSpan(checks).subspan(0, 48), absl::MakeSpan(big_match),
               [&] { big_done.Notify(); });
  ASSERT_TRUE(big_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (size_t i = 0; i < 48; ++i) EXPECT_EQ(big_match[i], want[i]) << "object " << i;
  EXPECT_EQ(fallback.objects.load(), 49u);
}

// With a mirror: objects inside the mirrored staging are checked in the mirror and, when they match,
// left there (device_copy = the mirror at their offset, holding their bytes); mismatches, failed
// reads and objects outside the mirror get no device copy.
TEST(GpuVerifierTest, MirrorKeepsCheckedObjectsOnTheDevice) {
  TUTTI_SKIP_WITHOUT_GPU();
  auto stream = IoStream::Create({0, 0, 0});
  ASSERT_TRUE(stream.ok()) << stream.status();
  CountingVerifier fallback;
  constexpr uint32_t kLen = 32768, kObjects = 96;
  Staging staging(uint64_t{kLen} * kObjects);
  Staging outside(uint64_t{kLen} * 2);
  GpuVerifierOptions options;
  options.slot_bytes = 1 << 20;  // scratch for 32 objects: the mirrored 96 need none
  options.max_objects_per_slot = 128;
  options.mirror = absl::MakeConstSpan(staging.data, staging.size);
  auto v = MakeGpuVerifier(options, **stream, &fallback);
  ASSERT_TRUE(v.ok()) << v.status();

  const std::vector<uint8_t> bytes = RandomBytes(staging.size, 11);
  std::memcpy(staging.data, bytes.data(), staging.size);
  std::memcpy(outside.data, bytes.data(), outside.size);
  Key key{};
  key.bytes[3] = 7;
  std::vector<const uint8_t*> copies(kObjects + 2, nullptr);
  std::vector<ObjectCheck> checks;
  for (uint32_t i = 0; i < kObjects + 2; ++i) {
    uint8_t* obj = i < kObjects ? staging.data + uint64_t{i} * kLen
                                : outside.data + uint64_t{i - kObjects} * kLen;
    checks.push_back(ObjectCheck{1, &key, 2, i, obj, kLen,
                                 pool::ObjectChecksum(1, key, 2, i, obj, kLen), &copies[i]});
  }
  checks[5].expected ^= 1;  // a mismatch
  checks[9].len = 0;        // a failed read
  std::vector<uint8_t> matches(checks.size(), 2);
  absl::Notification done;
  (*v)->Verify(1, checks, absl::MakeSpan(matches), [&] { done.Notify(); });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(fallback.objects.load(), 0u);
  std::vector<uint8_t> back(kLen);
  for (uint32_t i = 0; i < checks.size(); ++i) {
    const bool good = i != 5 && i != 9;
    EXPECT_EQ(matches[i], good ? 1 : 0) << "object " << i;
    if (!good || i >= kObjects) {
      EXPECT_EQ(copies[i], nullptr) << "object " << i;
      continue;
    }
    ASSERT_NE(copies[i], nullptr) << "object " << i;
    if (i > 0 && copies[i - 1] != nullptr) {
      EXPECT_EQ(copies[i] - copies[i - 1], kLen) << "the mirror keeps staging's offsets";
    }
    ASSERT_EQ(cudaMemcpy(back.data(), copies[i], kLen, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(back.data(), checks[i].bytes, kLen), 0) << "object " << i;
  }
  // A mirror that is not 16-byte aligned is refused.
  GpuVerifierOptions bad = options;
  bad.mirror = absl::MakeConstSpan(staging.data + 8, kLen);
  EXPECT_EQ(MakeGpuVerifier(bad, **stream, &fallback).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Placed objects (layers staged on the GPU): each is copied from its bounce slot to its place in
// device memory, checked there, and a match gets the place as its device copy, with no mirror;
// a batch the fallback checks places nothing.
TEST(GpuVerifierTest, PlacesObjectsWhereTheReaderSays) {
  TUTTI_SKIP_WITHOUT_GPU();
  auto stream = IoStream::Create({0, 0, 0});
  ASSERT_TRUE(stream.ok()) << stream.status();
  CountingVerifier fallback;
  constexpr uint32_t kLen = 32768, kObjects = 8;
  Staging bounce(uint64_t{kLen} * kObjects);
  uint8_t* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), uint64_t{kLen} * 2 * kObjects),
            cudaSuccess);
  GpuVerifierOptions options;
  options.slot_bytes = kLen;  // scratch for one object: placed ones need none
  options.max_objects_per_slot = 64;
  auto v = MakeGpuVerifier(options, **stream, &fallback);
  ASSERT_TRUE(v.ok()) << v.status();
  const std::vector<uint8_t> bytes = RandomBytes(bounce.size, 5);
  std::memcpy(bounce.data, bytes.data(), bounce.size);
  Key key{};
  key.bytes[1] = 3;
  std::vector<const uint8_t*> copies(kObjects, nullptr);
  std::vector<ObjectCheck> checks;
  for (uint32_t i = 0; i < kObjects; ++i) {
    uint8_t* obj = bounce.data + uint64_t{i} * kLen;
    // Places in reverse order and apart: the copy must follow the place, not the bounce offset.
    uint8_t* place = device + uint64_t{kObjects - 1 - i} * 2 * kLen;
    checks.push_back(ObjectCheck{1, &key, 2, i, obj, kLen,
                                 pool::ObjectChecksum(1, key, 2, i, obj, kLen), &copies[i], place});
  }
  checks[2].expected ^= 1;  // a mismatch
  std::vector<uint8_t> matches(checks.size(), 2);
  absl::Notification done;
  (*v)->Verify(1, checks, absl::MakeSpan(matches), [&] { done.Notify(); });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(fallback.objects.load(), 0u);
  std::vector<uint8_t> back(kLen);
  for (uint32_t i = 0; i < kObjects; ++i) {
    EXPECT_EQ(matches[i], i == 2 ? 0 : 1) << "object " << i;
    if (i == 2) {
      EXPECT_EQ(copies[i], nullptr);
      continue;
    }
    ASSERT_EQ(copies[i], checks[i].place) << "object " << i;
    ASSERT_EQ(cudaMemcpy(back.data(), copies[i], kLen, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(back.data(), checks[i].bytes, kLen), 0) << "object " << i;
  }
  // A length the kernel does not take goes to the fallback: checked, not placed.
  std::vector<ObjectCheck> odd = {checks[0]};
  const uint8_t* none = nullptr;
  odd[0].len = 4000;
  odd[0].expected = pool::ObjectChecksum(1, key, 2, 0, odd[0].bytes, 4000);
  odd[0].device_copy = &none;
  std::vector<uint8_t> odd_match(1, 2);
  absl::Notification odd_done;
  (*v)->Verify(1, odd, absl::MakeSpan(odd_match), [&] { odd_done.Notify(); });
  ASSERT_TRUE(odd_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(odd_match[0], 1);
  EXPECT_EQ(none, nullptr);
  v->reset();
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

// A batch of another stream queued behind a backlog is checked in turn with it, not after it: the
// kernel's stream is held (a host function waits) while one stream queues 20 batches and another
// one, each slot holding one batch. The first two slots may take the first stream's batches
// before the second stream queues; the slot after them takes the streams in turn.
TEST(GpuVerifierTest, StreamsQueuedAtOnceAreCheckedInTurn) {
  TUTTI_SKIP_WITHOUT_GPU();
  auto stream = IoStream::Create({0, 0, 0});
  ASSERT_TRUE(stream.ok()) << stream.status();
  CountingVerifier fallback;
  GpuVerifierOptions options;
  options.slot_bytes = 1 << 20;
  options.max_objects_per_slot = 16;  // one batch a slot
  auto v = MakeGpuVerifier(options, **stream, &fallback);
  ASSERT_TRUE(v.ok()) << v.status();
  constexpr uint32_t kLen = 32768, kPerBatch = 16, kLong = 20;
  Staging staging(uint64_t{kLen} * kPerBatch);  // every batch checks the same objects
  const std::vector<uint8_t> bytes = RandomBytes(staging.size, 11);
  std::memcpy(staging.data, bytes.data(), staging.size);
  Key key{};
  key.bytes[0] = 7;
  std::vector<ObjectCheck> checks(kPerBatch);
  for (uint32_t i = 0; i < kPerBatch; ++i) {
    uint8_t* obj = staging.data + uint64_t{i} * kLen;
    checks[i] =
        ObjectCheck{3, &key, 9, i, obj, kLen, pool::ObjectChecksum(3, key, 9, i, obj, kLen)};
  }
  std::atomic<bool> hold{true};
  ASSERT_EQ(cudaLaunchHostFunc((*stream)->stream(),
                               [](void* h) {
                                 while (static_cast<std::atomic<bool>*>(h)->load())
                                   std::this_thread::yield();
                               },
                               &hold),
            cudaSuccess);
  std::vector<std::vector<uint8_t>> matches(kLong + 1, std::vector<uint8_t>(kPerBatch, 2));
  std::mutex mu;
  std::vector<int> order;  // the stream of each batch answered, in order
  std::atomic<uint32_t> left{kLong + 1};
  absl::Notification all;
  auto answered = [&](int stream_id) {
    {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(stream_id);
    }
    if (left.fetch_sub(1) == 1) all.Notify();
  };
  for (uint32_t b = 0; b < kLong; ++b) {
    (*v)->Verify(1, checks, absl::MakeSpan(matches[b]), [&] { answered(1); });
  }
  (*v)->Verify(2, checks, absl::MakeSpan(matches[kLong]), [&] { answered(2); });
  hold.store(false);
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(20)));
  const auto second = std::find(order.begin(), order.end(), 2);
  ASSERT_NE(second, order.end());
  EXPECT_LE(second - order.begin(), 3) << "answered after the first stream's backlog";
  for (const auto& m : matches) EXPECT_EQ(m, std::vector<uint8_t>(kPerBatch, 1));
  EXPECT_EQ(fallback.objects.load(), 0u);
}

// While the kernel's stream is held (a kernel that runs for seconds), kBatches placed batches of
// one slot each are verified with kSlots slots. Without copy_on_arrival the verifier copies ahead
// into every free slot (their `released` run after the copies) and answers none: exactly kSlots
// batches are released, a later batch waiting for the oldest slot's answer (with two slots only
// two would be). With it every batch is copied and released as it arrives. Either way none is
// answered while the kernel is held, each is answered after its release, and the bytes scribbled
// over at release (the bounce slot reused) change nothing: the checks and the placed copies are
// of the bytes read.
void ReleasedWhileTheKernelIsHeld(bool copy_on_arrival) {
  auto stream = IoStream::Create({0, 0, 0});
  ASSERT_TRUE(stream.ok()) << stream.status();
  CountingVerifier fallback;
  constexpr uint32_t kLen = 32768, kPerBatch = 4, kBatches = 7, kSlots = 5;
  constexpr uint32_t kObjects = kPerBatch * kBatches;
  GpuVerifierOptions options;
  options.slot_bytes = kLen;
  options.max_objects_per_slot = kPerBatch;  // one batch a slot
  options.slots = kSlots;
  options.copy_on_arrival = copy_on_arrival;
  ArrivalCounters counters;
  options.counters = &counters;
  auto v = MakeGpuVerifier(options, **stream, &fallback);
  ASSERT_TRUE(v.ok()) << v.status();
  Staging bounce(uint64_t{kLen} * kObjects);
  const std::vector<uint8_t> bytes = RandomBytes(bounce.size, 13);
  std::memcpy(bounce.data, bytes.data(), bounce.size);
  uint8_t* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), bounce.size), cudaSuccess);
  void* busy = nullptr;
  ASSERT_EQ(cudaMalloc(&busy, 4096), cudaSuccess);
  cudaEvent_t held_end = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&held_end, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(testing::LaunchWriteFor(busy, 4096, 3'000'000'000ull, 1, (*stream)->stream()),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(held_end, (*stream)->stream()), cudaSuccess);
  Key key{};
  key.bytes[3] = 5;
  std::vector<const uint8_t*> copies;
  const std::vector<ObjectCheck> checks =
      PlacedChecks(2, key, 3, bounce.data, device, kObjects, kLen, &copies);
  std::vector<uint8_t> matches(kObjects, 9);
  std::atomic<uint32_t> released{0}, done{0};
  std::vector<std::atomic<int>> batch_released(kBatches), released_at_done(kBatches);
  absl::Notification all;
  for (uint32_t b = 0; b < kBatches; ++b) {
    (*v)->VerifyReleasing(
        1, absl::MakeConstSpan(checks).subspan(b * kPerBatch, kPerBatch),
        absl::MakeSpan(matches).subspan(b * kPerBatch, kPerBatch),
        [&, b] {
          std::memset(bounce.data + uint64_t{b} * kPerBatch * kLen, 0xee, kPerBatch * kLen);
          batch_released[b].fetch_add(1);
          released.fetch_add(1);
        },
        [&, b] {
          released_at_done[b].store(batch_released[b].load());
          if (done.fetch_add(1) + 1 == kBatches) all.Notify();
        });
  }
  // Copies take microseconds; the kernel holds the stream for 3 s.
  const uint32_t expected = copy_on_arrival ? kBatches : kSlots;
  while (released.load() < expected && cudaEventQuery(held_end) == cudaErrorNotReady) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A batch too many would be released right after the expected ones: give it time to show.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const uint32_t released_while_held = released.load();
  const uint32_t done_while_held = done.load();
  const bool still_held = cudaEventQuery(held_end) == cudaErrorNotReady;
  ASSERT_TRUE(still_held) << "the kernel ended before the checks' copies landed";
  EXPECT_EQ(released_while_held, expected) << "batches given back before the oldest was answered";
  EXPECT_EQ(done_while_held, 0u);
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(released.load(), kBatches);
  for (uint32_t b = 0; b < kBatches; ++b) {
    EXPECT_EQ(released_at_done[b].load(), 1) << "batch " << b << ": answered before released";
  }
  EXPECT_EQ(fallback.objects.load(), 0u);
  ExpectPlaced(checks, matches, copies, bytes);
  v->reset();
  // Copies on arrival counted: every batch, in one group or more, each with its time until its
  // copies were enqueued and from then until its bytes went back (counted before they go back).
  EXPECT_EQ(counters.arrivals.load(), copy_on_arrival ? kBatches : 0u);
  if (copy_on_arrival) {
    EXPECT_GE(counters.groups.load(), 1u);
    EXPECT_LE(counters.groups.load(), kBatches);
    EXPECT_GT(counters.pickup_ns.load(), 0u);
    EXPECT_GT(counters.copy_release_ns.load(), 0u);
  } else {
    EXPECT_EQ(counters.groups.load(), 0u);
  }
  EXPECT_EQ(cudaEventDestroy(held_end), cudaSuccess);
  EXPECT_EQ(cudaFree(busy), cudaSuccess);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

TEST(GpuVerifierTest, EverySlotCopiesAheadWhileTheKernelIsHeld) {
  TUTTI_SKIP_WITHOUT_GPU();
  ReleasedWhileTheKernelIsHeld(/*copy_on_arrival=*/false);
}

// GpuVerifierOptions::copy_on_arrival: every batch given back while no slot is free.
TEST(GpuVerifierTest, CopyOnArrivalReleasesEveryBatchWhileTheKernelIsHeld) {
  TUTTI_SKIP_WITHOUT_GPU();
  ReleasedWhileTheKernelIsHeld(/*copy_on_arrival=*/true);
}

// VerifyReleasing: each batch's `released` runs once its objects are copied to their places and
// before its `done`; the host bytes scribbled over right in `released` (the bounce slot reused)
// change nothing: the checks and the placed copies are of the bytes read. A batch the fallback
// takes is released only after the CPU has checked it.
void ReleasesTheHostBytesOnceCopiedBeforeTheAnswer(bool copy_on_arrival) {
  auto stream = IoStream::Create({0, 0, 0});
  ASSERT_TRUE(stream.ok()) << stream.status();
  CountingVerifier fallback;
  constexpr uint32_t kLen = 32768, kBatches = 32, kPerBatch = 4;
  constexpr uint32_t kObjects = kBatches * kPerBatch;
  Staging bounce(uint64_t{kLen} * kObjects);
  uint8_t* device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), uint64_t{kLen} * kObjects), cudaSuccess);
  GpuVerifierOptions options;
  options.slot_bytes = kLen;
  options.max_objects_per_slot = 16;  // several slots' worth: the two slots alternate
  options.copy_on_arrival = copy_on_arrival;
  auto v = MakeGpuVerifier(options, **stream, &fallback);
  ASSERT_TRUE(v.ok()) << v.status();
  const std::vector<uint8_t> bytes = RandomBytes(bounce.size, 11);
  std::memcpy(bounce.data, bytes.data(), bounce.size);
  Key key{};
  key.bytes[2] = 9;
  std::vector<const uint8_t*> copies;
  std::vector<ObjectCheck> checks =
      PlacedChecks(4, key, 5, bounce.data, device, kObjects, kLen, &copies);
  checks[7].expected ^= 1;  // a mismatch stays one
  std::vector<uint8_t> matches(kObjects, 9);
  std::vector<std::atomic<int>> released(kBatches), released_at_done(kBatches), done(kBatches);
  std::atomic<uint32_t> left{kBatches};
  absl::Notification all;
  for (uint32_t b = 0; b < kBatches; ++b) {
    (*v)->VerifyReleasing(
        1, absl::MakeConstSpan(checks).subspan(b * kPerBatch, kPerBatch),
        absl::MakeSpan(matches).subspan(b * kPerBatch, kPerBatch),
        [&, b] {
          std::memset(bounce.data + uint64_t{b} * kPerBatch * kLen, 0xee, kPerBatch * kLen);
          released[b].fetch_add(1);
        },
        [&, b] {
          released_at_done[b].store(released[b].load());
          done[b].fetch_add(1);
          if (left.fetch_sub(1) == 1) all.Notify();
        });
  }
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(fallback.objects.load(), 0u);
  for (uint32_t b = 0; b < kBatches; ++b) {
    EXPECT_EQ(released[b].load(), 1) << "batch " << b;
    EXPECT_EQ(released_at_done[b].load(), 1) << "batch " << b << ": released after its answer";
    EXPECT_EQ(done[b].load(), 1) << "batch " << b;
  }
  ExpectPlaced(checks, matches, copies, bytes, /*mismatch=*/7);
  // The fallback's batch: released after the CPU checked the bytes, which it found intact.
  std::memcpy(bounce.data, bytes.data(), kLen);
  std::vector<ObjectCheck> odd = {checks[0]};
  const uint8_t* none = nullptr;
  odd[0].len = 4000;
  odd[0].expected = pool::ObjectChecksum(4, key, 5, 0, odd[0].bytes, 4000);
  odd[0].device_copy = &none;
  std::vector<uint8_t> odd_match(1, 9);
  std::atomic<int> odd_released{0};
  absl::Notification odd_done;
  (*v)->VerifyReleasing(
      1, odd, absl::MakeSpan(odd_match),
      [&] {
        EXPECT_EQ(odd_match[0], datapath::kMatch) << "released before the CPU's answer";
        odd_released.fetch_add(1);
      },
      [&] { odd_done.Notify(); });
  ASSERT_TRUE(odd_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(odd_released.load(), 1);
  EXPECT_EQ(odd_match[0], datapath::kMatch);
  v->reset();
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

TEST(GpuVerifierTest, ReleasesTheHostBytesOnceCopiedBeforeTheAnswer) {
  TUTTI_SKIP_WITHOUT_GPU();
  ReleasesTheHostBytesOnceCopiedBeforeTheAnswer(/*copy_on_arrival=*/false);
}

// The same with each batch copied as it arrives.
TEST(GpuVerifierTest, CopiedOnArrivalReleasesTheHostBytesBeforeTheAnswer) {
  TUTTI_SKIP_WITHOUT_GPU();
  ReleasesTheHostBytesOnceCopiedBeforeTheAnswer(/*copy_on_arrival=*/true);
}

}  // namespace
}  // namespace tutti::gpu
