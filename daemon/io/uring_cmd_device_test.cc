// The "uring_cmd" backend against a real NVMe namespace: what it writes through passthrough reads
// back through the kernel's block device (O_DIRECT) and the reverse, byte for byte; the geometry
// matches the block device's; an out-of-range LBA comes back as the controller's error.
//
// Needs TUTTI_PASSTHROUGH_DEVICE (e.g. /dev/ng0n1) and TUTTI_BLOCK_DEVICE (the same namespace's
// block device, /dev/nvme0n1), root on kernels before 6.2, and a namespace whose contents may be
// overwritten past its first 1 MiB: tests/vm/passthrough_check.sh runs it in the QEMU guest.
// Elsewhere every test skips itself, saying so.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "daemon/io/aligned_buffer.h"
#include "daemon/io/uring_cmd_backend.h"
#include "gtest/gtest.h"

namespace tutti::io {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kBase = 256 * kMiB;  // test data lives here: away from a pool's superblock

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

void Fill(uint8_t* p, uint64_t len, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (uint64_t i = 0; i < len; ++i) {
    x = x * 1103515245u + 12345u;
    p[i] = static_cast<uint8_t>(x >> 16);
  }
}

class UringCmdDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ng_ = Env("TUTTI_PASSTHROUGH_DEVICE");
    blk_ = Env("TUTTI_BLOCK_DEVICE");
    if (ng_.empty() || blk_.empty()) {
      GTEST_SKIP() << "no NVMe namespace: set TUTTI_PASSTHROUGH_DEVICE and TUTTI_BLOCK_DEVICE "
                      "(tests/vm/passthrough_check.sh does, in the QEMU guest)";
    }
    block_fd_ = open(blk_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    ASSERT_GE(block_fd_, 0) << blk_ << ": " << std::strerror(errno);
  }
  void TearDown() override {
    if (block_fd_ >= 0) close(block_fd_);
  }
  std::unique_ptr<UringCmdBackend> Open(const UringCmdOptions& o = {}) {
    auto fds = OpenPassthroughDevices({ng_});
    EXPECT_TRUE(fds.ok()) << fds.status();
    if (!fds.ok()) return nullptr;
    auto b = UringCmdBackend::Create(*fds, o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : nullptr;
  }

  std::string ng_, blk_;
  int block_fd_ = -1;
};

TEST_F(UringCmdDeviceTest, GeometryMatchesTheBlockDevice) {
  auto b = Open();
  ASSERT_NE(b, nullptr);
  uint64_t bytes = 0;
  int lba = 0;
  ASSERT_EQ(ioctl(block_fd_, BLKGETSIZE64, &bytes), 0);
  ASSERT_EQ(ioctl(block_fd_, BLKSSZGET, &lba), 0);
  EXPECT_EQ(b->file_size(0), bytes);
  EXPECT_EQ(b->info(0).bytes, bytes);
  EXPECT_EQ(b->info(0).lba_bytes, static_cast<uint32_t>(lba));
  EXPECT_GE(b->info(0).nsid, 1u);
  EXPECT_GE(b->info(0).max_transfer_bytes, 4096u);
}

// Writes through passthrough (a small registered buffer for some requests, a plain one for
// another larger than a command, so it is split), then reads through the block device.
TEST_F(UringCmdDeviceTest, PassthroughWritesReadBackThroughTheBlockDevice) {
  auto b = Open();
  ASSERT_NE(b, nullptr);
  AlignedBuffer fixed(256 * 1024), plain(2 * kMiB), check(2 * kMiB);
  ASSERT_TRUE(b->RegisterBuffer(absl::MakeSpan(fixed.data(), 256 * 1024)).ok());
  Fill(fixed.data(), 256 * 1024, 1);
  Fill(plain.data(), 2 * kMiB, 2);
  std::vector<IoRequest> reqs = {
      {Op::kWrite, 0, kBase, fixed.data(), 128 * 1024},
      {Op::kWrite, 0, kBase + 8 * kMiB, fixed.data() + 128 * 1024, 4096},
      {Op::kWrite, 0, kBase + 16 * kMiB, plain.data(), static_cast<uint32_t>(2 * kMiB)},  // split
  };
  b->Execute(absl::MakeSpan(reqs));
  for (const IoRequest& r : reqs) ASSERT_EQ(r.result, r.len) << "offset " << r.offset;
  ASSERT_TRUE(b->Sync(0).ok());
  const UringCmdCounters c = b->counters();
  EXPECT_EQ(c.fixed_buffer_ops, 2u);
  EXPECT_EQ(c.fixed_buffer_refusals, 0u);
  EXPECT_GE(c.commands, 2u + 2 * kMiB / b->info(0).max_transfer_bytes);
  EXPECT_EQ(c.controller_errors, 0u);
  EXPECT_EQ(c.flushes, b->info(0).volatile_write_cache ? 1u : 0u);

  for (const IoRequest& r : reqs) {
    ASSERT_EQ(pread(block_fd_, check.data(), r.len, r.offset), static_cast<ssize_t>(r.len));
    EXPECT_EQ(std::memcmp(check.data(), r.buf, r.len), 0) << "offset " << r.offset;
  }
}

// Writes through the block device, reads through passthrough into a large registered buffer (the
// store's case: 1024 pages, more than Linux 6.1 takes in one fixed buffer, hence the pieces) and a
// plain one.
TEST_F(UringCmdDeviceTest, BlockDeviceWritesReadBackThroughPassthrough) {
  AlignedBuffer data(kMiB), fixed(4 * kMiB), plain(64 * 1024);
  Fill(data.data(), kMiB, 3);
  const uint64_t at = kBase + 32 * kMiB;
  ASSERT_EQ(pwrite(block_fd_, data.data(), kMiB, at), static_cast<ssize_t>(kMiB));
  ASSERT_EQ(fdatasync(block_fd_), 0);
  auto b = Open();
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->RegisterBuffer(absl::MakeSpan(fixed.data(), 4 * kMiB)).ok());
  std::vector<IoRequest> reqs = {
      {Op::kRead, 0, at, fixed.data(), static_cast<uint32_t>(kMiB)},
      {Op::kRead, 0, at + 512 * 1024, plain.data(), 64 * 1024},
  };
  b->Execute(absl::MakeSpan(reqs));
  ASSERT_EQ(reqs[0].result, reqs[0].len);
  ASSERT_EQ(reqs[1].result, reqs[1].len);
  EXPECT_EQ(std::memcmp(fixed.data(), data.data(), kMiB), 0);
  EXPECT_EQ(std::memcmp(plain.data(), data.data() + 512 * 1024, 64 * 1024), 0);
  // Registered in 256 KiB pieces, the 1 MiB read is four fixed commands the kernel takes.
  EXPECT_EQ(b->counters().fixed_buffer_ops, 4u);
  EXPECT_EQ(b->counters().fixed_buffer_refusals, 0u);
}

// Past the namespace's end the backend's own check answers -EINVAL; with the test's extra bytes the
// request reaches the controller, which fails it (LBA out of range): -ERANGE, counted and logged
// with the NVMe status. A request beside it in the same batch still succeeds.
TEST_F(UringCmdDeviceTest, OutOfRangeLbaIsTheControllersErrorWithItsStatus) {
  UringCmdOptions o;
  o.test_extra_bytes = kMiB;
  auto b = Open(o);
  ASSERT_NE(b, nullptr);
  const uint64_t end = b->info(0).bytes;
  AlignedBuffer buf(2 * 4096);
  std::vector<IoRequest> reqs = {
      {Op::kRead, 0, end, buf.data(), 4096},
      {Op::kRead, 0, kBase, buf.data() + 4096, 4096},
  };
  b->Execute(absl::MakeSpan(reqs));
  EXPECT_EQ(reqs[0].result, -ERANGE);
  EXPECT_EQ(reqs[1].result, 4096);
  EXPECT_EQ(b->counters().controller_errors, 1u);

  auto strict = Open();
  ASSERT_NE(strict, nullptr);
  IoRequest r{Op::kRead, 0, end, buf.data(), 4096};
  strict->Execute(absl::MakeSpan(&r, 1));
  EXPECT_EQ(r.result, -EINVAL);
  EXPECT_EQ(strict->counters().commands, 0u);
}

}  // namespace
}  // namespace tutti::io
