// ProbeVfio and VfioDevice::Open against a made-up sysfs and /dev: every reason the "nvme" backend
// cannot run is named, with the path. (A real controller: vfio_device_test in the QEMU guest.)
#include "daemon/io/nvme/vfio.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace tutti::io::nvme {
namespace {

namespace fs = std::filesystem;
constexpr char kAddr[] = "0000:00:04.0";

class VfioProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(std::getenv("TEST_TMPDIR")) / "vfio";
    fs::remove_all(root_);
    options_.pci_address = kAddr;
    options_.sysfs_root = (root_ / "sys").string();
    options_.dev_root = (root_ / "dev").string();
    // A controller bound to vfio-pci, alone in IOMMU group 5, and the vfio nodes.
    AddDevice(kAddr, "0x010802", "vfio-pci", 5);
    fs::create_directories(root_ / "dev/vfio");
    std::ofstream(root_ / "dev/vfio/vfio").put('\n');
    std::ofstream(root_ / "dev/vfio/5").put('\n');
  }

  fs::path Device(const std::string& addr) { return root_ / "sys/bus/pci/devices" / addr; }
  void Bind(const std::string& addr, const std::string& driver) {
    fs::remove(Device(addr) / "driver");
    if (!driver.empty()) fs::create_symlink("../../../bus/pci/drivers/" + driver, Device(addr) / "driver");
  }
  void AddDevice(const std::string& addr, const std::string& cls, const std::string& driver,
                 int group) {
    fs::create_directories(Device(addr));
    std::ofstream(Device(addr) / "class") << cls << "\n";
    Bind(addr, driver);
    const fs::path g = root_ / "sys/kernel/iommu_groups" / std::to_string(group);
    fs::create_directories(g / "devices");
    fs::create_symlink(g, Device(addr) / "iommu_group");
    fs::create_symlink(Device(addr), g / "devices" / addr);
  }
  absl::Status Probe() { return ProbeVfio(options_); }

  fs::path root_;
  VfioOptions options_;
};

TEST_F(VfioProbeTest, UsableWhenBoundToVfioAloneInItsGroup) { EXPECT_TRUE(Probe().ok()) << Probe(); }

TEST_F(VfioProbeTest, MalformedAddress) {
  options_.pci_address = "00:04.0";
  EXPECT_EQ(Probe().code(), absl::StatusCode::kInvalidArgument) << Probe();
}

TEST_F(VfioProbeTest, NoSuchDevice) {
  options_.pci_address = "0000:00:05.0";
  const absl::Status s = Probe();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("/bus/pci/devices/0000:00:05.0: No such file"), std::string::npos) << s;
}

TEST_F(VfioProbeTest, NotAnNvmeController) {
  std::ofstream(Device(kAddr) / "class") << "0x020000\n";
  const absl::Status s = Probe();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("is not an NVMe controller"), std::string::npos) << s;
}

TEST_F(VfioProbeTest, BoundToNvmeSaysHowToBind) {
  Bind(kAddr, "nvme");
  const absl::Status s = Probe();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("bound to nvme, not vfio-pci: run tools/nvme_bind.sh bind 0000:00:04.0"),
            std::string::npos) << s;
  Bind(kAddr, "");
  EXPECT_NE(Probe().message().find("bound to no driver"), std::string::npos) << Probe();
}

TEST_F(VfioProbeTest, NoIommuGroup) {
  fs::remove(Device(kAddr) / "iommu_group");
  const absl::Status s = Probe();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("no IOMMU group"), std::string::npos) << s;
  EXPECT_NE(s.message().find("intel_iommu=on"), std::string::npos) << s;
}

TEST_F(VfioProbeTest, GroupWithADeviceOnAnotherDriverIsNotViable) {
  AddDevice("0000:00:04.1", "0x020000", "e1000e", 5);
  AddDevice("0000:00:04.2", "0x060400", "pcieport", 5);  // bridges are allowed
  const absl::Status s = Probe();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("IOMMU group 5 is not viable: 0000:00:04.1 (e1000e)"),
            std::string::npos) << s;
  EXPECT_EQ(s.message().find("0000:00:04.2"), std::string::npos) << s;
  Bind("0000:00:04.1", "vfio-pci");
  EXPECT_TRUE(Probe().ok()) << Probe();
}

TEST_F(VfioProbeTest, NoVfioModule) {
  fs::remove(root_ / "dev/vfio/vfio");
  const absl::Status s = Probe();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("dev/vfio/vfio: No such file or directory: no vfio: modprobe vfio-pci"),
            std::string::npos) << s;
}

TEST_F(VfioProbeTest, GroupNodeNotAccessible) {
  if (::geteuid() == 0) GTEST_SKIP() << "root passes access(2) whatever the mode";
  ::chmod((root_ / "dev/vfio/5").c_str(), 0);
  const absl::Status s = Probe();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("dev/vfio/5: Permission denied: tuttid needs root or the vfio group's owner"),
            std::string::npos) << s;
}

TEST_F(VfioProbeTest, OpenNamesTheFailingIoctlAndPath) {
  // The probe passes, but /dev/vfio/vfio here is a plain file: the first ioctl fails.
  auto device = VfioDevice::Open(options_);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
  EXPECT_NE(device.status().message().find("VFIO_GET_API_VERSION on " + options_.dev_root +
                                           "/vfio/vfio: Inappropriate ioctl for device"),
            std::string::npos) << device.status();
}

TEST_F(VfioProbeTest, OpenFailsWithTheProbesReason) {
  Bind(kAddr, "nvme");
  auto device = VfioDevice::Open(options_);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status(), Probe());
}

}  // namespace
}  // namespace tutti::io::nvme
