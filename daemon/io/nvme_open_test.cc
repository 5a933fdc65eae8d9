#include "daemon/io/nvme_open.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "daemon/io/aligned_buffer.h"
#include "daemon/io/nvme/model/controller_model.h"
#include "daemon/io/nvme/spec.h"
#include "daemon/pool/raw_pool.h"
#include "gtest/gtest.h"

namespace tutti::io {
namespace {

using nvme::ControllerModel;

// Opens model controllers; when one is destroyed, records its CSTS.SHST bits at that moment.
struct ModelOpener {
  std::vector<std::shared_ptr<ControllerModel>> kept;  // models reopened instead of new ones
  std::vector<std::string> opened, closed;
  std::vector<uint32_t> shst_at_close;
  std::string fail_on;  // an address answered UNAVAILABLE

  NvmeDeviceOpener Get() {
    return [this](const std::string& address) -> absl::StatusOr<OpenedNvmeDevice> {
      if (address == fail_on) return absl::UnavailableError("nvme: " + address + ": no vfio");
      if (opened.size() < kept.size()) {  // the same SSD again, as after a restart
        OpenedNvmeDevice d;
        d.owner = kept[opened.size()];
        d.regs = kept[opened.size()].get();
        d.dma = kept[opened.size()].get();
        opened.push_back(address);
        return d;
      }
      auto model = ControllerModel::Create(nvme::ModelOptions{});
      if (!model.ok()) return model.status();
      OpenedNvmeDevice d;
      d.regs = model->get();
      d.dma = model->get();
      d.owner =
          std::shared_ptr<ControllerModel>(model->release(), [this, address](ControllerModel* m) {
            shst_at_close.push_back(m->Read32(nvme::kRegCsts) & nvme::kCstsShstMask);
            closed.push_back(address);
            delete m;
          });
      opened.push_back(address);
      return d;
    };
  }
};

NvmeOpenOptions TwoSsds() {
  NvmeOpenOptions o;
  o.pci_addresses = {"0000:01:00.0", "0000:02:00.0"};
  o.queue_depth = 32;
  return o;
}

TEST(NvmeOpenTest, OwnsTheDevicesAndShutsTheControllersDownBeforeClosingThem) {
  ModelOpener models;
  {
    auto backend = OpenNvmeBackend(TwoSsds(), models.Get());
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->name(), "nvme");
    ASSERT_EQ((*backend)->num_files(), 2u);
    EXPECT_EQ((*backend)->file_size(1), nvme::ModelOptions{}.namespace_blocks * 4096);
    AlignedBuffer out(8192), in(8192);
    memset(out.data(), 0x5a, out.size());
    IoRequest write{Op::kWrite, 1, 4096, out.data(), 8192};
    (*backend)->Execute(absl::MakeSpan(&write, 1));
    ASSERT_EQ(write.result, 8192);
    ASSERT_TRUE((*backend)->Sync(1).ok());
    IoRequest read{Op::kRead, 1, 4096, in.data(), 8192};
    (*backend)->Execute(absl::MakeSpan(&read, 1));
    ASSERT_EQ(read.result, 8192);
    EXPECT_EQ(memcmp(out.data(), in.data(), 8192), 0);
    EXPECT_TRUE(models.closed.empty());  // the devices live as long as the backend
  }
  EXPECT_EQ(models.closed, (std::vector<std::string>{"0000:02:00.0", "0000:01:00.0"}));
  EXPECT_EQ(models.shst_at_close,
            (std::vector<uint32_t>{nvme::kCstsShstComplete, nvme::kCstsShstComplete}));
}

// The pool on the namespace (daemon/pool/raw_pool.h) over tuttid's driver: created on a fresh
// namespace, found again after the controller was shut down and brought up anew, and a namespace
// holding an ext4 superblock is refused with nothing written.
TEST(NvmeOpenTest, ThePoolOnTheNamespaceSurvivesAControllerRestart) {
  auto model = ControllerModel::Create(nvme::ModelOptions{});
  ASSERT_TRUE(model.ok()) << model.status();
  std::shared_ptr<ControllerModel> ssd(std::move(*model));
  NvmeOpenOptions o;
  o.pci_addresses = {"0000:01:00.0"};
  auto layout = pool::PoolLayout::Compute(16 << 20, 1, 32 << 10, 8, 0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::array<uint8_t, 16> uuid{};
  for (int start = 0; start < 2; ++start) {
    ModelOpener models;
    models.kept = {ssd};
    auto backend = OpenNvmeBackend(o, models.Get());
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto pool = pool::OpenOrCreateRawPool(backend->get(), o.pci_addresses, *layout);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ(pool->created, start == 0);
    if (start == 0) uuid = pool->uuid;
    EXPECT_EQ(pool->uuid, uuid);
  }
  EXPECT_EQ(memcmp(ssd->namespace_data(), "TUTTIPOL", 8), 0);

  std::memset(ssd->namespace_data(), 0, 4096);  // now an ext4 filesystem's superblock magic
  ssd->namespace_data()[1080] = 0x53;
  ssd->namespace_data()[1081] = 0xef;
  ModelOpener models;
  models.kept = {ssd};
  auto backend = OpenNvmeBackend(o, models.Get());
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto pool =
      pool::OpenOrCreateRawPool(backend->get(), o.pci_addresses, *layout, "io.nvme_devices");
  ASSERT_TRUE(absl::IsFailedPrecondition(pool.status())) << pool.status();
  EXPECT_NE(pool.status().message().find("or fix io.nvme_devices"), std::string::npos);
  EXPECT_NE(pool.status().message().find("ext2/3/4"), std::string::npos) << pool.status();
  EXPECT_EQ(ssd->namespace_data()[0], 0);  // nothing written
}

TEST(NvmeOpenTest, AnUnavailableDeviceClosesTheOnesOpenedAndSaysWhy) {
  ModelOpener models;
  models.fail_on = "0000:02:00.0";
  auto backend = OpenNvmeBackend(TwoSsds(), models.Get());
  ASSERT_TRUE(absl::IsUnavailable(backend.status())) << backend.status();
  EXPECT_NE(backend.status().message().find("0000:02:00.0: no vfio"), std::string::npos);
  EXPECT_EQ(models.closed, std::vector<std::string>{"0000:01:00.0"});
  EXPECT_EQ(models.shst_at_close, std::vector<uint32_t>{nvme::kCstsShstComplete});
}

TEST(NvmeOpenTest, AControllerThatCannotComeUpIsAnErrorNamingItsAddress) {
  ModelOpener models;
  NvmeOpenOptions o = TwoSsds();
  o.nsid = 9;  // the model has namespace 1 only
  auto backend = OpenNvmeBackend(o, models.Get());
  ASSERT_FALSE(backend.ok());
  EXPECT_FALSE(absl::IsUnavailable(backend.status())) << backend.status();
  EXPECT_NE(backend.status().message().find("nvme 0000:01:00.0"), std::string::npos)
      << backend.status();
  EXPECT_EQ(models.closed, std::vector<std::string>{"0000:01:00.0"});
}

TEST(NvmeOpenTest, WithoutVfioTheProbeReasonComesBackAsUnavailable) {
  NvmeOpenOptions o;
  o.pci_addresses = {"0000:01:00.0"};
  o.sysfs_root = testing::TempDir() + "/no-such-sysfs";
  o.dev_root = testing::TempDir() + "/no-such-dev";
  auto backend = OpenNvmeBackend(o);
  ASSERT_TRUE(absl::IsUnavailable(backend.status())) << backend.status();
  EXPECT_EQ(backend.status().message().rfind("io.nvme_devices: 0000:01:00.0: ", 0), 0u)
      << backend.status();
}

TEST(NvmeOpenTest, NoDevicesIsInvalid) {
  auto backend = OpenNvmeBackend(NvmeOpenOptions{}, ModelOpener{}.Get());
  EXPECT_TRUE(absl::IsInvalidArgument(backend.status())) << backend.status();
  EXPECT_NE(backend.status().message().find("io.nvme_devices"), std::string::npos);
}

}  // namespace
}  // namespace tutti::io
