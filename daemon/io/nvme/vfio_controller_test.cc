// The controller driver (controller.h, queue_pair.h) on a real controller through vfio.h: in CI,
// QEMU's emulated NVMe controller behind its emulated IOMMU (tests/vm/guest_nvme.sh binds it and
// runs this binary with TUTTI_VFIO_PCI=<address>, TUTTI_VFIO_SERIAL=<its serial>). Without
// TUTTI_VFIO_PCI every test skips itself. It WRITES the namespace: only for a scratch device.
//
// Bring-up and Identify, reads and writes with the data checked (SGL and PRP forms), ring
// wrap-around with more requests than slots, an out-of-range LBA refused by the controller next
// to a good request of the same batch, Flush, shutdown (I/O afterwards fails).
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/io/nvme/controller.h"
#include "daemon/io/nvme/queue_pair.h"
#include "daemon/io/nvme/vfio.h"

namespace tutti::io::nvme {
namespace {

constexpr size_t kBuffer = 4 << 20;  // first half written from, second half read into
constexpr size_t kHalf = kBuffer / 2;

class VfioControllerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const char* pci = std::getenv("TUTTI_VFIO_PCI");
    if (pci == nullptr || *pci == '\0') {
      GTEST_SKIP() << "no TUTTI_VFIO_PCI: needs a scratch controller bound to vfio-pci (the QEMU "
                      "guest, tests/vm/guest_nvme.sh)";
    }
    VfioOptions vo;
    vo.pci_address = pci;
    auto device = VfioDevice::Open(vo);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    Start(/*depth=*/64);
  }
  void TearDown() override {
    region_.reset();
    buffer_.reset();
    controller_.reset();
  }

  void Start(uint32_t depth) {
    region_.reset();
    controller_.reset();
    ControllerOptions co;
    co.io_queues = 2;
    co.io_queue_depth = depth;
    co.use_sgl = GetParam();
    co.admin_timeout_ms = 30000;  // software emulation is slow
    co.io_timeout_ms = 30000;
    auto c = Controller::Create(co, &device_->registers(), &device_->dma());
    ASSERT_TRUE(c.ok()) << c.status();
    controller_ = std::move(*c);
    if (buffer_ == nullptr) {
      auto b = device_->dma().Allocate(kBuffer);
      ASSERT_TRUE(b.ok()) << b.status();
      buffer_ = std::move(*b);
    }
    auto r = controller_->Register(*buffer_);
    ASSERT_TRUE(r.ok()) << r.status();
    region_ = std::move(*r);
  }

  QueuePair* qp() { return controller_->queue_pair(0); }
  uint32_t lba() const { return controller_->ns().lba_size(); }
  NvmeRequest Io(NvmeOp op, uint64_t lba, uint64_t bytes, uint64_t offset) {
    NvmeRequest r;
    r.op = op;
    r.lba = lba;
    r.blocks = static_cast<uint32_t>(bytes / this->lba());
    r.region = region_.get();
    r.offset = offset;
    return r;
  }
  uint8_t Pattern(uint64_t i, uint32_t seed) const {
    return static_cast<uint8_t>(seed * 131 + i * 31 + i / 4096);
  }
  void Fill(uint64_t offset, uint64_t len, uint32_t seed) {
    for (uint64_t i = 0; i < len; ++i) buffer_->host()[offset + i] = Pattern(i, seed);
  }
  // The first offset in [offset, offset + len) that differs from the pattern, or -1.
  int64_t Mismatch(uint64_t offset, uint64_t len, uint32_t seed) const {
    for (uint64_t i = 0; i < len; ++i) {
      if (buffer_->host()[offset + i] != Pattern(i, seed)) return static_cast<int64_t>(i);
    }
    return -1;
  }
  // Writes [from, from + len) of the buffer to `lba_at`, reads it back into the second half.
  void RoundTrip(uint64_t lba_at, uint64_t from, uint64_t len, uint32_t seed) {
    Fill(from, len, seed);
    std::memset(buffer_->host() + kHalf, 0, len);
    std::vector<NvmeRequest> w = {Io(NvmeOp::kWrite, lba_at, len, from)};
    qp()->Execute(absl::MakeSpan(w));
    ASSERT_EQ(w[0].result, static_cast<int64_t>(len)) << "write status " << w[0].status;
    std::vector<NvmeRequest> r = {Io(NvmeOp::kRead, lba_at, len, kHalf)};
    qp()->Execute(absl::MakeSpan(r));
    ASSERT_EQ(r[0].result, static_cast<int64_t>(len)) << "read status " << r[0].status;
    EXPECT_EQ(Mismatch(kHalf, len, seed), -1) << len << " bytes at LBA " << lba_at;
  }

  std::unique_ptr<VfioDevice> device_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<DmaBuffer> buffer_;
  std::unique_ptr<RegisteredRegion> region_;
};

TEST_P(VfioControllerTest, BringUpAndIdentify) {
  const ControllerInfo& info = controller_->info();
  std::printf("controller: serial '%s' model '%s' fw '%s' VS 0x%08x MQES+1 %u MDTS %u B, SGL %d, "
              "VWC %d; namespace %u: %lu blocks of %u B; %u queue pairs of %u; %s\n",
              info.serial.c_str(), info.model.c_str(), info.firmware.c_str(), info.version,
              info.max_queue_entries, info.mdts_bytes, info.sgl, info.volatile_write_cache,
              controller_->ns().nsid, static_cast<unsigned long>(controller_->ns().blocks), lba(),
              controller_->num_queue_pairs(), qp()->depth(),
              controller_->uses_sgl() ? "SGL descriptors" : "PRP lists");
  const char* serial = std::getenv("TUTTI_VFIO_SERIAL");
  if (serial != nullptr) {
    EXPECT_EQ(info.serial, serial);
  }
  EXPECT_GE(info.version, 0x00010000u);
  EXPECT_GT(controller_->ns().blocks, 0u);
  EXPECT_EQ(controller_->num_queue_pairs(), 2u);
  EXPECT_EQ(controller_->uses_sgl(), GetParam() && info.sgl);
}

TEST_P(VfioControllerTest, WritesAndReadsWithTheDataChecked) {
  RoundTrip(0, 0, 4096, 1);
  RoundTrip(1000, 4096, controller_->max_transfer(), 2);  // one command of the largest size
  RoundTrip(controller_->ns().blocks - 8192 / lba(), 512 * 1024, 8192, 3);  // the last LBAs
  // A batch of 32 writes at scattered LBAs, then one batch reading them all back.
  Fill(0, 32 * 16384, 4);
  std::vector<NvmeRequest> w, r;
  for (uint64_t i = 0; i < 32; ++i) {
    w.push_back(Io(NvmeOp::kWrite, 4096 + i * 997, 16384, i * 16384));
    r.push_back(Io(NvmeOp::kRead, 4096 + i * 997, 16384, kHalf + i * 16384));
  }
  qp()->Execute(absl::MakeSpan(w));
  std::memset(buffer_->host() + kHalf, 0, 32 * 16384);
  qp()->Execute(absl::MakeSpan(r));
  for (const NvmeRequest& x : w) EXPECT_EQ(x.result, 16384) << "write status " << x.status;
  for (const NvmeRequest& x : r) EXPECT_EQ(x.result, 16384) << "read status " << x.status;
  EXPECT_EQ(Mismatch(kHalf, 32 * 16384, 4), -1);
}

TEST_P(VfioControllerTest, RingWrapsAroundWithMoreRequestsThanSlots) {
  Start(/*depth=*/8);  // 7 commands in flight at most: 40 requests wrap the ring five times
  ASSERT_EQ(qp()->depth(), 8u);
  Fill(0, 40 * 4096, 5);
  std::vector<NvmeRequest> w;
  for (uint64_t i = 0; i < 40; ++i) w.push_back(Io(NvmeOp::kWrite, 20000 + 8 * i, 4096, i * 4096));
  qp()->Execute(absl::MakeSpan(w));
  for (const NvmeRequest& x : w) EXPECT_EQ(x.result, 4096) << "write status " << x.status;
  std::memset(buffer_->host() + kHalf, 0, 40 * 4096);
  for (uint64_t i = 0; i < 40; i += 3) {  // small batches: the phase flips many times
    std::vector<NvmeRequest> r;
    for (uint64_t j = i; j < std::min<uint64_t>(i + 3, 40); ++j) {
      r.push_back(Io(NvmeOp::kRead, 20000 + 8 * j, 4096, kHalf + j * 4096));
    }
    qp()->Execute(absl::MakeSpan(r));
    for (const NvmeRequest& x : r) EXPECT_EQ(x.result, 4096) << "read status " << x.status;
  }
  EXPECT_EQ(Mismatch(kHalf, 40 * 4096, 5), -1);
  EXPECT_EQ(qp()->in_flight(), 0u);
}

TEST_P(VfioControllerTest, OutOfRangeLbaIsRefusedNextToAGoodRequest) {
  const uint64_t end = controller_->ns().blocks;
  std::vector<NvmeRequest> batch = {Io(NvmeOp::kRead, end - 1, 2 * lba(), kHalf),
                                    Io(NvmeOp::kRead, 0, 4096, kHalf + 4096)};
  qp()->Execute(absl::MakeSpan(batch));
  std::printf("read of 2 LBAs at %lu of %lu: result %ld, NVMe status 0x%x\n",
              static_cast<unsigned long>(end - 1), static_cast<unsigned long>(end),
              static_cast<long>(batch[0].result), batch[0].status);
  EXPECT_LT(batch[0].result, 0);
  EXPECT_EQ(batch[0].status, 0x0080) << "SCT 0 SC 0x80: LBA Out of Range";
  EXPECT_EQ(batch[1].result, 4096) << "the good request of the batch completes";
}

TEST_P(VfioControllerTest, FlushThenShutdownThenIoFails) {
  RoundTrip(300, 0, 4096, 6);
  EXPECT_TRUE(qp()->Flush().ok()) << qp()->Flush();
  ASSERT_TRUE(controller_->Shutdown().ok());
  EXPECT_EQ((device_->registers().Read32(0x1c) >> 2) & 3, 2u) << "CSTS.SHST: complete";
  std::vector<NvmeRequest> r = {Io(NvmeOp::kRead, 300, 4096, kHalf)};
  qp()->Execute(absl::MakeSpan(r));
  EXPECT_EQ(r[0].result, -EIO);
}

INSTANTIATE_TEST_SUITE_P(Descriptors, VfioControllerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Sgl" : "Prp";
                         });

}  // namespace
}  // namespace tutti::io::nvme
