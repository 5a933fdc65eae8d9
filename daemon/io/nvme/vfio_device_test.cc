// VfioDevice against a real controller bound to vfio-pci: in CI, QEMU's emulated NVMe controller
// behind its emulated IOMMU (tests/vm/guest_nvme.sh binds it and runs this binary with
// TUTTI_VFIO_PCI=<address>, TUTTI_VFIO_SERIAL=<its serial>). Without TUTTI_VFIO_PCI every test
// skips itself. The admin-queue test drives the controller with a few raw commands (no controller.h
// here) only to prove that DMA through the IOMMU mapping works both ways.
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/io/nvme/vfio.h"

namespace tutti::io::nvme {
namespace {

// NVMe base spec 3.1 registers.
constexpr size_t kCap = 0x0, kVs = 0x8, kCc = 0x14, kCsts = 0x1c, kAqa = 0x24, kAsq = 0x28,
                 kAcq = 0x30, kSq0Tail = 0x1000;

int HugePagesFree() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  unsigned long long value = 0;
  while (meminfo >> key >> value) {
    if (key == "HugePages_Free:") return static_cast<int>(value);
    meminfo.ignore(256, '\n');
  }
  return 0;
}

class VfioDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* pci = std::getenv("TUTTI_VFIO_PCI");
    if (pci == nullptr || *pci == '\0') {
      GTEST_SKIP() << "no TUTTI_VFIO_PCI: needs a controller bound to vfio-pci (the QEMU guest, "
                      "tests/vm/guest_nvme.sh)";
    }
    options_.pci_address = pci;
    auto device = VfioDevice::Open(options_);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
  }

  // Polls CSTS until (CSTS & mask) == want; false after 10 s (emulation is slow).
  bool WaitCsts(uint32_t mask, uint32_t want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while ((device_->registers().Read32(kCsts) & mask) != want) {
      if (absl::Now() > deadline) return false;
    }
    return true;
  }

  VfioOptions options_;
  std::unique_ptr<VfioDevice> device_;
};

TEST_F(VfioDeviceTest, ProbeSaysUsable) { EXPECT_TRUE(ProbeVfio(options_).ok()) << ProbeVfio(options_); }

TEST_F(VfioDeviceTest, Bar0ReadsCapAndVersion) {
  RegisterSpace& bar = device_->registers();
  const uint64_t cap = bar.Read64(kCap);
  const uint32_t vs = bar.Read32(kVs);
  std::printf("vfio %s: IOMMU group %d, BAR0 %zu bytes (%zu mapped), CAP 0x%016lx, VS 0x%08x\n",
              device_->pci_address().c_str(), device_->iommu_group(), device_->bar0_region_size(),
              bar.size(), static_cast<unsigned long>(cap), vs);
  EXPECT_GT(cap & 0xffff, 0u) << "CAP.MQES";
  EXPECT_TRUE((cap >> 37) & 1) << "CAP.CSS: the NVM command set";
  EXPECT_GE(vs, 0x00010000u) << "VS: NVMe 1.0 or later";
  EXPECT_EQ(cap & 0xffffffff, bar.Read32(kCap)) << "32- and 64-bit reads agree";
  EXPECT_GE(bar.size(), kSq0Tail + 8);
  EXPECT_EQ(reinterpret_cast<volatile uint8_t*>(bar.DoorbellAddress(kSq0Tail)) -
                reinterpret_cast<volatile uint8_t*>(bar.DoorbellAddress(0)),
            static_cast<ptrdiff_t>(kSq0Tail));
}

TEST_F(VfioDeviceTest, DmaAllocateMapAndUnmap) {
  DmaAllocator& dma = device_->dma();
  auto small = dma.Allocate(100);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ((*small)->size(), 4096u);
  EXPECT_EQ((*small)->host()[4095], 0) << "zeroed";
  const int free_before = HugePagesFree();
  auto large = dma.Allocate(4 << 20);  // hugepages if the guest has any, else normal pages
  ASSERT_TRUE(large.ok()) << large.status();
  const int used = free_before - HugePagesFree();
  std::printf("4 MiB of DMA memory: %d hugepages used (%d were free)\n", used, free_before);
  EXPECT_EQ(used, free_before >= 2 ? 2 : 0);
  EXPECT_NE((*small)->iova(), (*large)->iova());
  EXPECT_EQ((*large)->iova() % 4096, 0u);
  void* mine = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mine, MAP_FAILED);
  auto mapped = dma.Map(static_cast<uint8_t*>(mine), 8192);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->host(), mine);
  EXPECT_EQ(device_->dma_mapped_bytes(), 4096u + (4u << 20) + 8192u);
  EXPECT_EQ(dma.Map(static_cast<uint8_t*>(mine) + 1, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  small->reset();
  large->reset();
  mapped->reset();
  EXPECT_EQ(device_->dma_mapped_bytes(), 0u) << "unmapped on destruction";
  ::munmap(mine, 8192);
}

TEST_F(VfioDeviceTest, BuffersMayOutliveTheDevice) {
  auto buffer = device_->dma().Allocate(4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  device_.reset();
  (*buffer)->host()[0] = 1;  // still this process's memory; unmapped when it goes
  buffer->reset();
  auto again = VfioDevice::Open(options_);  // the group was released
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(VfioDeviceTest, SecondOpenOfTheGroupIsRefusedWithTheReason) {
  auto second = VfioDevice::Open(options_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find("/vfio/" + std::to_string(device_->iommu_group()) +
                                           ": Device or resource busy: the group is open in "
                                           "another process"),
            std::string::npos) << second.status();
  std::printf("a second open: %s\n", second.status().ToString().c_str());
}

// Reset, admin queue, Identify Controller into caller memory mapped with Map(), shutdown: the
// controller reads the submission queue and writes the completion and the data through the IOMMU.
TEST_F(VfioDeviceTest, IdentifyThroughTheIommu) {
  RegisterSpace& bar = device_->registers();
  DmaAllocator& dma = device_->dma();
  bar.Write32(kCc, 0);
  ASSERT_TRUE(WaitCsts(1, 0)) << "CSTS.RDY did not clear";
  auto sq = dma.Allocate(4096), cq = dma.Allocate(4096);
  ASSERT_TRUE(sq.ok() && cq.ok());
  void* data = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(data, MAP_FAILED);
  auto id = dma.Map(static_cast<uint8_t*>(data), 4096);
  ASSERT_TRUE(id.ok()) << id.status();
  bar.Write32(kAqa, (1u << 16) | 1u);  // 2-entry queues (sizes are 0's based)
  bar.Write64(kAsq, (*sq)->iova());
  bar.Write64(kAcq, (*cq)->iova());
  bar.Write32(kCc, (4u << 20) | (6u << 16) | 1u);  // IOCQES 16 B, IOSQES 64 B, EN
  ASSERT_TRUE(WaitCsts(1, 1)) << "CSTS.RDY did not set";
  uint32_t* sqe = reinterpret_cast<uint32_t*>((*sq)->host());
  sqe[0] = 0x06 | (0x1234u << 16);  // Identify, command id 0x1234
  const uint64_t prp1 = (*id)->iova();
  std::memcpy(&sqe[6], &prp1, sizeof(prp1));
  sqe[10] = 1;  // CNS 1: the controller
  *bar.DoorbellAddress(kSq0Tail) = 1;
  volatile uint32_t* cqe = reinterpret_cast<volatile uint32_t*>((*cq)->host());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (((cqe[3] >> 16) & 1) == 0) {
    ASSERT_LT(absl::Now(), deadline) << "no completion";
  }
  EXPECT_EQ(cqe[3] & 0xffff, 0x1234u) << "command id";
  EXPECT_EQ((cqe[3] >> 17) & 0x7fff, 0u) << "status";
  const std::string serial(static_cast<char*>(data) + 4, 20), model(static_cast<char*>(data) + 24, 40);
  std::printf("Identify by DMA: serial '%s' model '%s'\n", serial.c_str(), model.c_str());
  const char* want = std::getenv("TUTTI_VFIO_SERIAL");
  if (want != nullptr) {
    EXPECT_EQ(serial.substr(0, std::strlen(want)), want);
  }
  EXPECT_NE(model.find_first_not_of(' '), std::string::npos) << "the model came by DMA";
  bar.Write32(kCc, bar.Read32(kCc) | (1u << 14));  // CC.SHN = 01: normal shutdown
  EXPECT_TRUE(WaitCsts(3u << 2, 2u << 2)) << "CSTS.SHST never said complete";
  id->reset();
  ::munmap(data, 4096);
}

}  // namespace
}  // namespace tutti::io::nvme
