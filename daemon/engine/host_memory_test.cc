#include "daemon/engine/host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::engine {
namespace {

using ::testing::HasSubstr;

// A shared-memory object the test (playing the engine) creates, maps and unlinks.
class ShmObject {
 public:
  explicit ShmObject(uint64_t size) : size_(size) {
    static std::atomic<int> counter{0};
    // Not getpid(): tests in Bazel's sandbox share /dev/shm and may share a pid.
    name_ = absl::StrCat("/tutti_hm_test_", std::random_device{}(), "_", counter++);
    fd_ = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd_, 0) << strerror(errno);
    EXPECT_EQ(ftruncate(fd_, size), 0);
    base_ = static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    EXPECT_NE(base_, MAP_FAILED);
  }
  ~ShmObject() {
    munmap(base_, size_);
    close(fd_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  uint8_t* data() { return base_; }
  int fd() const { return fd_; }

 private:
  std::string name_;
  uint64_t size_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
};

// One region per (object, declared size): the engine hands over a duplicate of its descriptor.
std::vector<HostShmRegion> Regions(std::vector<std::pair<const ShmObject*, uint64_t>> objects) {
  std::vector<HostShmRegion> out;
  for (const auto& [obj, size] : objects) {
    out.push_back({obj->name(), UniqueFd(dup(obj->fd())), size});
  }
  return out;
}

HostShmRegion FromFd(int fd, uint64_t size) { return {"fd", UniqueFd(fd), size}; }

std::vector<HostShmRegion> One(HostShmRegion r) {
  std::vector<HostShmRegion> out;
  out.push_back(std::move(r));
  return out;
}

constexpr uint32_t kBlocks = 8, kObjects = 4, kLen = 256;

// Separate K and V regions per "layer pair": objects 0 and 2 in region 0, 1 and 3 in region 1.
std::vector<ObjectPlacement> TwoRegionPlacements() {
  const uint64_t stride = 2 * kLen;
  return {{0, 0, stride}, {1, 0, stride}, {0, kLen, stride}, {1, kLen, stride}};
}

TEST(HostMemoryTest, ScatterWritesWhereTheEngineReadsAndGatherReadsBack) {
  ShmObject k(kBlocks * 2 * kLen), v(kBlocks * 2 * kLen);
  auto mem = HostMemory::Create(Regions({{&k, kBlocks * 2 * kLen}, {&v, kBlocks * 2 * kLen}}),
                                TwoRegionPlacements(), kBlocks, kObjects, kLen);
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ((*mem)->kind(), "host_shm");
  EXPECT_EQ((*mem)->num_blocks(), kBlocks);

  std::vector<uint8_t> src(kLen);
  for (uint32_t i = 0; i < kLen; ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<CopyOp> ops = {{5, 3, src.data()}};  // block 5, object 3: region 1, offset 5*512+256
  ASSERT_TRUE((*mem)->Scatter(ops).ok());
  EXPECT_EQ(std::memcmp(v.data() + 5 * 2 * kLen + kLen, src.data(), kLen), 0);

  // The engine writes block 2 object 0; Gather sees it.
  std::memset(k.data() + 2 * 2 * kLen, 0xAB, kLen);
  std::vector<uint8_t> dst(kLen, 0);
  std::vector<CopyOp> gops = {{2, 0, dst.data()}};
  ASSERT_TRUE((*mem)->Gather(gops).ok());
  EXPECT_EQ(dst, std::vector<uint8_t>(kLen, 0xAB));
}

TEST(HostMemoryTest, MappingOutlivesTheName) {
  auto obj = std::make_unique<ShmObject>(kLen);
  auto mem = HostMemory::Create(Regions({{obj.get(), kLen}}), {{0, 0, kLen}}, 1, 1, kLen);
  ASSERT_TRUE(mem.ok()) << mem.status();
  shm_unlink(obj->name().c_str());  // the engine may unlink right after Attach
  std::vector<uint8_t> src(kLen, 0x5A);
  std::vector<CopyOp> ops = {{0, 0, src.data()}};
  ASSERT_TRUE((*mem)->Scatter(ops).ok());
  EXPECT_EQ(obj->data()[kLen - 1], 0x5A);
}

TEST(HostMemoryTest, DescriptorsThatAreNotWritableSharedMemoryAreInvalidArgument) {
  ShmObject obj(4096);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  close(pipe_fds[1]);
  const int dir = open("/", O_RDONLY | O_DIRECTORY);
  const int read_only = open(("/dev/shm" + obj.name()).c_str(), O_RDONLY);
  ASSERT_GE(dir, 0);
  ASSERT_GE(read_only, 0) << strerror(errno);
  const std::pair<int, const char*> cases[] = {
      {pipe_fds[0], "not shared memory"},
      {dir, "not shared memory"},
      {read_only, "not open read-write"},
      {-1, "fstat"},
  };
  for (const auto& [fd, why] : cases) {
    auto mem = HostMemory::Create(One(FromFd(fd, 4096)), {{0, 0, 4096}}, 1, 1, 4096);
    ASSERT_FALSE(mem.ok()) << why;
    EXPECT_EQ(mem.status().code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_THAT(std::string(mem.status().message()), HasSubstr("regions[0]"));
    EXPECT_THAT(std::string(mem.status().message()), HasSubstr(why));
  }
}

// Attaching a large sparse region must not fill it (MAP_POPULATE did: 2 GiB of tmpfs).
TEST(HostMemoryTest, AttachTouchesNoPagesOfASparseRegion) {
  constexpr uint64_t kSparse = 2ull << 30;
  const int fd = memfd_create("tutti_sparse", MFD_CLOEXEC);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(ftruncate(fd, kSparse), 0);
  auto mem = HostMemory::Create(One(FromFd(dup(fd), kSparse)), {{0, 0, 4096}}, 1, 1, 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_blocks, 0) << "attach allocated " << st.st_blocks * 512 << " bytes";
  // A copy touches only the block the layout places there.
  std::vector<uint8_t> src(4096, 1);
  std::vector<CopyOp> ops = {{0, 0, src.data()}};
  ASSERT_TRUE((*mem)->Scatter(ops).ok());
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_LE(st.st_blocks * 512, 64 * 1024);
  close(fd);
}

TEST(HostMemoryTest, DeclaredSizeLargerThanObjectIsRejected) {
  ShmObject obj(4096);
  auto mem = HostMemory::Create(Regions({{&obj, 8192}}), {{0, 0, 4096}}, 2, 1, 4096);
  ASSERT_FALSE(mem.ok());
  EXPECT_EQ(mem.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mem.status().message()), HasSubstr("exceeds the object's size"));
}

TEST(HostMemoryTest, PlacementsPastTheRegionNameTheirIndex) {
  ShmObject a(4096), b(4096);
  // Placement 1 needs offset 2048 + (2 - 1) x 2048 + 1024 = 5120 > 4096.
  auto mem = HostMemory::Create(Regions({{&a, 4096}, {&b, 4096}}),
                                {{0, 0, 2048}, {1, 2048, 2048}}, 2, 2, 1024);
  ASSERT_FALSE(mem.ok());
  EXPECT_EQ(mem.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mem.status().message()), HasSubstr("placements[1]"));
  auto wrong_region = HostMemory::Create(Regions({{&a, 4096}}), {{3, 0, 1024}}, 1, 1, 1024);
  ASSERT_FALSE(wrong_region.ok());
  EXPECT_THAT(std::string(wrong_region.status().message()), HasSubstr("placements[0].region"));
  auto no_regions = HostMemory::Create({}, {{0, 0, 1024}}, 1, 1, 1024);
  EXPECT_EQ(no_regions.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostMemoryTest, ShrunkObjectFailsCopiesInsteadOfCrashing) {
  ShmObject obj(8192);
  auto mem = HostMemory::Create(Regions({{&obj, 8192}}), {{0, 0, 4096}}, 2, 1, 4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  ASSERT_EQ(ftruncate(obj.fd(), 4096), 0);
  std::vector<uint8_t> buf(4096);
  std::vector<CopyOp> ops = {{1, 0, buf.data()}};
  EXPECT_EQ((*mem)->Scatter(ops).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*mem)->Gather(ops).code(), absl::StatusCode::kFailedPrecondition);
}

// The engine shrinks its object while the daemon copies: without the SIGBUS guard this kills the
// test process. Repeated until a shrink has landed mid-copy at least once (it nearly always does
// at the first try: the size check before the copies takes microseconds, the copies milliseconds).
TEST(HostMemoryTest, ShrinkRacingWithCopiesFailsThemInsteadOfCrashing) {
  constexpr uint32_t kBig = 1 << 20, kCount = 32;
  bool caught_mid_copy = false;
  for (int attempt = 0; attempt < 20 && !caught_mid_copy; ++attempt) {
    ShmObject obj(uint64_t{kBig} * kCount);
    std::memset(obj.data(), 0x77, uint64_t{kBig} * kCount);
    auto mem = HostMemory::Create(Regions({{&obj, uint64_t{kBig} * kCount}}), {{0, 0, kBig}}, kCount,
                                  1, kBig);
    ASSERT_TRUE(mem.ok()) << mem.status();
    std::vector<uint8_t> staging(uint64_t{kBig} * kCount);
    std::vector<CopyOp> ops;
    for (uint32_t b = 0; b < kCount; ++b) ops.push_back({b, 0, staging.data() + uint64_t{b} * kBig});
    std::thread engine([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ASSERT_EQ(ftruncate(obj.fd(), 0), 0);
    });
    absl::Status status;
    for (int i = 0; i < 1000 && status.ok(); ++i) {
      status = i % 2 == 0 ? (*mem)->Gather(ops) : (*mem)->Scatter(ops);
      // Every call that succeeded moved the real bytes.
      if (status.ok() && i % 2 == 0) {
        ASSERT_EQ(staging[uint64_t{kCount - 1} * kBig + 5], 0x77);
      }
    }
    engine.join();
    ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    caught_mid_copy = absl::StrContains(status.message(), "during a copy");
    // Once shrunk, the memory stays refused, whichever check saw it first.
    EXPECT_EQ((*mem)->Gather(ops).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*mem)->Scatter(ops).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(caught_mid_copy) << "no shrink landed mid-copy in 20 tries";
}

}  // namespace
}  // namespace tutti::engine
