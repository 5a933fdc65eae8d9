#include "gpu/host_device.h"

#include <xxhash.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

using Op = HostDevice::Op;

TEST(HostDeviceTest, CopiesRunAtOnceAndLandInDeviceMemory) {
  HostDevice d;
  uint8_t* dev = d.Allocate(4096, "a").value();
  std::vector<uint8_t> src(4096, 7);
  ASSERT_TRUE(d.CopyToDevice(dev, src.data(), src.size(), d.io_stream(), "h2d").ok());
  EXPECT_EQ(dev[4095], 7);
  // Outside any allocation: what a GPU would fault on.
  EXPECT_EQ(d.CopyToDevice(src.data(), dev, 16, d.io_stream(), "bad").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(d.CopyToDevice(dev + 4000, src.data(), 200, d.io_stream(), "past end").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(d.count(Op::kCopyToDevice), 1u);
  d.Free(dev);
  EXPECT_EQ(d.live_allocations(), 0u);
}

TEST(HostDeviceTest, KernelReadsOnlyDeviceOrPinnedMemory) {
  HostDevice d;
  uint8_t* dev = d.Allocate(64, "a").value();
  auto pinned = d.AllocatePinned(64).value();
  std::memset(pinned->host(), 3, 64);
  CopyDesc desc{pinned->host(), dev};
  ASSERT_TRUE(d.LaunchCopy(&desc, 1, 64, d.io_stream(), "kernel").ok());
  EXPECT_EQ(dev[63], 3);
  alignas(16) uint8_t pageable[64] = {};
  desc = {pageable, dev};
  EXPECT_FALSE(d.LaunchCopy(&desc, 1, 64, d.io_stream(), "kernel").ok());
  EXPECT_EQ(d.kernel_objects(), 1u);
  d.Free(dev);
}

// The copy engines take runs: objects adjacent on both sides go as one copy, the bytes as given.
TEST(HostDeviceTest, CopyEnginesMergeAdjacentObjectsIntoRuns) {
  HostDevice d;
  uint8_t* dev = d.Allocate(8 * 64, "a").value();
  auto pinned = d.AllocatePinned(8 * 64).value();
  uint8_t* host = static_cast<uint8_t*>(pinned->host());
  for (int i = 0; i < 8 * 64; ++i) host[i] = static_cast<uint8_t>(i);
  // Objects 2, 0, 1 to device 0, 1, 2 in the wrong order, objects 3 to 5 in place: runs
  // {0, 1} -> {1, 2}, {2} -> {0} and {3, 4, 5} -> {3, 4, 5}.
  std::vector<CopyDesc> descs;
  for (auto [from, to] : {std::pair{4, 4}, {2, 0}, {0, 1}, {1, 2}, {3, 3}, {5, 5}}) {
    descs.push_back({host + from * 64, dev + to * 64});
  }
  const std::vector<uint32_t> groups(descs.size(), 0);  // one allocation on each side
  ASSERT_TRUE(
      d.CopyByCopyEngine(descs.data(), groups.data(), descs.size(), 64, d.io_stream(), "ce").ok());
  EXPECT_EQ(d.copy_engine_objects(), 6u);
  EXPECT_EQ(d.copy_engine_runs(), 3u);
  for (const CopyDesc& c : descs) {
    EXPECT_EQ(std::memcmp(c.dst, c.src, 64), 0);
  }
  d.Free(dev);
}

// The hash kernel: libxxhash's XXH3_64bits_withSeed over device memory, results in pinned memory;
// host memory it was not given (or registered) and unsupported lengths are misuse.
TEST(HostDeviceTest, HashKernelHashesDeviceMemoryLikeLibxxhash) {
  HostDevice d;
  uint8_t* dev = d.Allocate(8192, "a").value();
  for (int i = 0; i < 8192; ++i) dev[i] = static_cast<uint8_t>(i * 13 + 1);
  auto pinned = d.AllocatePinned(4096).value();
  auto* descs = reinterpret_cast<HashDesc*>(pinned->host());
  auto* hashes = reinterpret_cast<uint64_t*>(pinned->host() + 1024);
  descs[0] = {dev, 77, 4096};
  descs[1] = {dev + 4096, 78, 2048};
  ASSERT_TRUE(d.LaunchHash(descs, 2, hashes, d.io_stream(), "hash").ok());
  EXPECT_EQ(hashes[0], XXH3_64bits_withSeed(dev, 4096, 77));
  EXPECT_EQ(hashes[1], XXH3_64bits_withSeed(dev + 4096, 2048, 78));
  EXPECT_EQ(d.count(Op::kLaunchHash), 1u);
  descs[0] = {dev, 77, 100};  // XXH3 hashes short inputs another way: the CPU's
  EXPECT_EQ(d.LaunchHash(descs, 1, hashes, d.io_stream(), "short").code(),
            absl::StatusCode::kInternal);
  std::vector<uint8_t> heap(4096 + 16);
  descs[0] = {heap.data() + (16 - reinterpret_cast<uintptr_t>(heap.data()) % 16) % 16, 1, 4096};
  EXPECT_EQ(d.LaunchHash(descs, 1, hashes, d.io_stream(), "pageable").code(),
            absl::StatusCode::kInternal);
  d.RegisterHost(heap.data(), heap.size());  // registered host memory is still not device memory
  EXPECT_EQ(d.LaunchHash(descs, 1, hashes, d.io_stream(), "registered").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(d.live_allocations(), 2u) << "registered memory is the caller's";
  d.UnregisterHost(heap.data());
  d.FailOp(Op::kLaunchHash, 0, absl::InternalError("injected"));
  descs[0] = {dev, 77, 4096};
  hashes[0] = 0;
  EXPECT_EQ(d.LaunchHash(descs, 1, hashes, d.io_stream(), "failed").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(hashes[0], 0u) << "a failed launch does nothing";
  d.Free(dev);
}

TEST(HostDeviceTest, AWaitThatCouldNeverEndFails) {
  HostDevice d;
  auto* w = reinterpret_cast<uint32_t*>(d.Allocate(4, "w").value());
  *w = 0;
  auto s = d.CreateStream("s").value();
  ASSERT_TRUE(d.WriteValue32(s, w, 5, "write").ok());
  EXPECT_TRUE(d.WaitValue32(d.io_stream(), w, 5, "wait").ok());
  EXPECT_EQ(d.WaitValue32(d.io_stream(), w, 6, "wait").code(),
            absl::StatusCode::kFailedPrecondition);
  // The stream stays stuck, as a GPU stream would: later calls on it fail, other streams run.
  EXPECT_EQ(d.SyncStream(d.io_stream(), "sync").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.WriteValue32(d.io_stream(), w, 6, "write").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(d.WriteValue32(s, w, 7, "write").ok());
  d.DestroyStream(s);
  EXPECT_EQ(d.WriteValue32(s, w, 1, "destroyed stream").code(), absl::StatusCode::kInternal);
}

TEST(HostDeviceTest, InjectedFailureHitsOnceAndDoesNothing) {
  HostDevice d;
  uint8_t* dev = d.Allocate(64, "a").value();
  uint8_t src[64];
  std::memset(src, 1, sizeof(src));
  d.FailOp(Op::kCopyToDevice, 1, absl::InternalError("injected"));
  ASSERT_TRUE(d.CopyToDevice(dev, src, 64, d.io_stream(), "1").ok());
  std::memset(src, 2, sizeof(src));
  EXPECT_EQ(d.CopyToDevice(dev, src, 64, d.io_stream(), "2").message(), "injected");
  EXPECT_EQ(dev[0], 1);
  EXPECT_TRUE(d.CopyToDevice(dev, src, 64, d.io_stream(), "3").ok());
  EXPECT_EQ(dev[0], 2);
  EXPECT_EQ(d.count(Op::kCopyToDevice), 2u);
  d.Free(dev);
}

TEST(HostDeviceTest, TimingEventsMeasureHostTime) {
  HostDevice d;
  auto a = d.CreateEvent(Device::EventKind::kTiming, "a").value();
  auto b = d.CreateEvent(Device::EventKind::kTiming, "b").value();
  auto plain = d.CreateEvent(Device::EventKind::kBlocking, "c").value();
  ASSERT_TRUE(d.RecordEvent(a, d.io_stream(), "a").ok());
  ASSERT_TRUE(d.RecordEvent(b, d.io_stream(), "b").ok());
  ASSERT_TRUE(d.RecordEvent(plain, d.io_stream(), "c").ok());
  EXPECT_TRUE(d.EventDone(b));
  auto ms = d.ElapsedMs(a, b);
  ASSERT_TRUE(ms.ok());
  EXPECT_GE(*ms, 0.0f);
  EXPECT_FALSE(d.ElapsedMs(a, plain).ok());  // not a timing event
  for (auto e : {a, b, plain}) d.DestroyEvent(e);
}

}  // namespace
}  // namespace tutti::gpu
