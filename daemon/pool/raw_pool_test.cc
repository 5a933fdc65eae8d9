#include "daemon/pool/raw_pool.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "daemon/io/aligned_buffer.h"
#include "daemon/io/memory_backend.h"
#include "gtest/gtest.h"

namespace tutti::pool {
namespace {

constexpr uint64_t kMiB = 1 << 20;

PoolLayout Layout(uint32_t files, uint64_t capacity = 64 * kMiB) {
  auto l = PoolLayout::Compute(capacity, files, 32 << 10, 64, 0);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

class RawPoolTest : public ::testing::Test {
 protected:
  // `n` namespaces of `bytes` each on one MemoryDisk that outlives the backends over it.
  void MakeDisk(uint32_t n, uint64_t bytes = 64 * kMiB) {
    disk_ = *io::MemoryDisk::Create(std::vector<uint64_t>(n, bytes));
    devices_.clear();
    for (uint32_t i = 0; i < n; ++i) devices_.push_back("/dev/ng" + std::to_string(i) + "n1");
  }
  absl::StatusOr<RawPool> Open(const PoolLayout& layout) {
    auto io = io::MemoryBackend::CreateOn(disk_);
    return OpenOrCreateRawPool(io.get(), devices_, layout);
  }
  void Write(uint32_t ns, uint64_t offset, const std::string& bytes) {
    io::AlignedBuffer page(4096);
    const uint64_t base = offset / 4096 * 4096;
    std::string old = disk_->Peek(ns, base, 4096);
    std::memcpy(page.data(), old.data(), 4096);
    std::memcpy(page.data() + (offset - base), bytes.data(), bytes.size());
    auto io = io::MemoryBackend::CreateOn(disk_);
    io::IoRequest r{io::Op::kWrite, ns, base, page.data(), 4096};
    io->Execute(absl::MakeSpan(&r, 1));
    ASSERT_EQ(r.result, 4096);
    ASSERT_TRUE(io->Sync(ns).ok());
  }

  std::shared_ptr<io::MemoryDisk> disk_;
  std::vector<std::string> devices_;
};

TEST_F(RawPoolTest, CreatesOnFreshNamespacesAndReopensTheSamePool) {
  MakeDisk(2);
  const PoolLayout layout = Layout(2);
  auto created = Open(layout);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->created);
  // Superblocks at LBA 0 of each namespace, durable (they survive a crash).
  disk_->SimulateCrash();
  EXPECT_EQ(disk_->Peek(0, 0, 8), "TUTTIPOL");
  EXPECT_EQ(disk_->Peek(1, 0, 8), "TUTTIPOL");
  EXPECT_EQ(disk_->Peek(1, 12, 1)[0], 1);  // file index of namespace 1
  auto reopened = Open(layout);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_FALSE(reopened->created);
  EXPECT_EQ(reopened->uuid, created->uuid);
  // Creation writes nothing but the superblocks: slot headers stay as they were (zeros).
  EXPECT_EQ(disk_->Peek(0, 4096, 4096), std::string(4096, '\0'));
}

TEST_F(RawPoolTest, RefusesAFilesystemAndLeavesItUntouched) {
  MakeDisk(1);
  Write(0, 1080, "\x53\xef");  // ext4's superblock magic
  const std::string before = disk_->Peek(0, 0, 8192);
  auto pool = Open(Layout(1));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pool.status().message().find("/dev/ng0n1 holds an ext2/3/4 filesystem"),
            std::string::npos)
      << pool.status();
  EXPECT_NE(pool.status().message().find("dd if=/dev/zero"), std::string::npos);
  EXPECT_EQ(disk_->Peek(0, 0, 8192), before);
}

TEST_F(RawPoolTest, RefusesOtherDataAnywhereInTheFirstMiB) {
  MakeDisk(1);
  Write(0, kRawProbeBytes - 4096, "x");
  auto pool = Open(Layout(1));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pool.status().message().find("data (first non-zero byte at offset 1044480)"),
            std::string::npos)
      << pool.status();
}

TEST_F(RawPoolTest, RefusesAnotherPoolsNamespace) {
  MakeDisk(2);
  const PoolLayout layout = Layout(2);
  ASSERT_TRUE(Open(layout).ok());
  // Namespace 1 gets the superblock of another pool (of the same layout).
  auto other_disk = *io::MemoryDisk::Create({64 * kMiB, 64 * kMiB});
  auto other = io::MemoryBackend::CreateOn(other_disk);
  ASSERT_TRUE(OpenOrCreateRawPool(other.get(), devices_, layout).ok());
  Write(1, 0, other_disk->Peek(1, 0, 4096));
  auto pool = Open(layout);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pool.status().message().find("mixes two pools"), std::string::npos) << pool.status();
}

TEST_F(RawPoolTest, RefusesSwappedNamespacesAndAnotherLayout) {
  MakeDisk(2);
  ASSERT_TRUE(Open(Layout(2)).ok());
  std::swap(devices_[0], devices_[1]);
  Write(0, 0, disk_->Peek(1, 0, 4096));  // namespace 0 now holds file 1's superblock
  auto pool = Open(Layout(2));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pool.status().message().find("restore the order of io.passthrough_devices"),
            std::string::npos)
      << pool.status();

  MakeDisk(1);
  ASSERT_TRUE(Open(Layout(1, 64 * kMiB)).ok());
  pool = Open(Layout(1, 32 * kMiB));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pool.status().message().find("another layout"), std::string::npos) << pool.status();
}

TEST_F(RawPoolTest, RefusesFreshBesidePooledAndACorruptSuperblock) {
  MakeDisk(2);
  ASSERT_TRUE(Open(Layout(2)).ok());
  Write(1, 0, std::string(4096, '\0'));  // namespace 1 erased (or replaced)
  auto pool = Open(Layout(2));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pool.status().message().find("/dev/ng1n1 is fresh while /dev/ng0n1 holds a tutti pool"),
            std::string::npos)
      << pool.status();

  MakeDisk(1);
  ASSERT_TRUE(Open(Layout(1)).ok());
  disk_->Corrupt(0, 100, 1);
  EXPECT_EQ(Open(Layout(1)).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(RawPoolTest, RefusesANamespaceTooSmallForTheLayoutAndReportsReadErrors) {
  MakeDisk(1, 16 * kMiB);
  auto pool = Open(Layout(1, 64 * kMiB));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pool.status().message().find("lower pool.capacity_bytes"), std::string::npos);

  MakeDisk(1);
  disk_->FailNext(0, io::Op::kRead, 1, EIO);
  pool = Open(Layout(1));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(pool.status().message().find("Input/output error"), std::string::npos);
}

TEST(RawPoolCapacityTest, IsTheSmallerOfConfiguredAndWhatTheNamespacesHold) {
  const std::vector<uint64_t> two = {1 << 30, 3ull << 30};
  EXPECT_EQ(RawPoolCapacity(4ull << 30, two), 2ull << 30);  // 2 x the smaller namespace
  EXPECT_EQ(RawPoolCapacity(1ull << 30, two), 1ull << 30);
  EXPECT_EQ(RawPoolCapacity(1ull << 30, {}), 0u);
}

TEST(ForeignContentsTest, NamesKnownSignaturesAndOtherData) {
  std::vector<uint8_t> buf(kRawProbeBytes, 0);
  EXPECT_EQ(ForeignContents(buf.data(), buf.size()), "");
  std::memcpy(&buf[512], "EFI PART", 8);
  EXPECT_EQ(ForeignContents(buf.data(), buf.size()), "a GPT partition table");
  std::fill(buf.begin(), buf.end(), 0);
  std::memcpy(&buf[0], "XFSB", 4);
  EXPECT_EQ(ForeignContents(buf.data(), buf.size()), "an XFS filesystem");
  std::fill(buf.begin(), buf.end(), 0);
  std::memcpy(&buf[65600], "_BHRfS_M", 8);
  EXPECT_EQ(ForeignContents(buf.data(), buf.size()), "a btrfs filesystem");
  std::fill(buf.begin(), buf.end(), 0);
  buf[7] = 1;
  EXPECT_EQ(ForeignContents(buf.data(), buf.size()), "data (first non-zero byte at offset 7)");
}

}  // namespace
}  // namespace tutti::pool
