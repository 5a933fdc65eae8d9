// The sysfs walk of tuttictl devices, against fake sysfs trees built in a temporary directory
// (the layouts copied from real machines: an NVMe namespace and its partition, a multipath
// namespace, a virtio disk, device-mapper over two NVMe namespaces, a device with no sysfs entry).
#include "client/tuttictl/devices.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace tutti::tuttictl {
namespace {

namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tutti-sysfs-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  // A symlink at `rel` to `target` (relative to the link's directory, as sysfs has them).
  void Link(const std::string& rel, const std::string& target) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    fs::create_directory_symlink(target, p);
  }
  // An NVMe controller nvme<c> at PCI address `pci` with namespace nvme<c>n1 (and its partition
  // p1), the way the kernel lays them out; `dev` is the namespace's major:minor.
  void AddNvme(int c, const std::string& pci, const std::string& dev) {
    const std::string ctrl = "devices/pci0000:00/" + pci + "/nvme/nvme" + std::to_string(c);
    const std::string ns = "nvme" + std::to_string(c) + "n1";
    Write(ctrl + "/model", "QEMU NVMe Ctrl                          ");
    Write(ctrl + "/serial", "tutti-" + std::to_string(c) + "   ");
    Write(ctrl + "/firmware_rev", "8.0.0   ");
    Write(ctrl + "/transport", "pcie");
    Write(ctrl + "/address", pci);
    Write(ctrl + "/" + ns + "/size", "2097152");  // 1 GiB in 512-byte sectors
    Write(ctrl + "/" + ns + "/nsid", "1");
    Link(ctrl + "/" + ns + "/device", "../../nvme" + std::to_string(c));
    Write(ctrl + "/" + ns + "/" + ns + "p1/partition", "1");
    Write(ctrl + "/" + ns + "/" + ns + "p1/size", "2095104");
    Link("class/block/" + ns, "../../" + ctrl + "/" + ns);
    Link("class/block/" + ns + "p1", "../../" + ctrl + "/" + ns + "/" + ns + "p1");
    Link("dev/block/" + dev, "../../" + ctrl + "/" + ns);
  }

  fs::path root_;
};

TEST_F(FakeSysfs, NvmeNamespaceHasItsControllersAttributes) {
  AddNvme(0, "0000:00:04.0", "259:0");
  auto dev = ResolveBlockDevice(root_.string(), 259, 0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(dev->block_device, "nvme0n1");
  EXPECT_EQ(dev->not_nvme, "");
  ASSERT_EQ(dev->disks.size(), 1u);
  const Disk& d = dev->disks[0];
  EXPECT_TRUE(d.nvme);
  EXPECT_EQ(d.kind, "NVMe namespace");
  EXPECT_EQ(d.name, "nvme0n1");
  EXPECT_EQ(d.nsid, 1u);
  EXPECT_EQ(d.controller, "nvme0");
  EXPECT_EQ(d.model, "QEMU NVMe Ctrl");
  EXPECT_EQ(d.serial, "tutti-0");
  EXPECT_EQ(d.firmware, "8.0.0");
  EXPECT_EQ(d.transport, "pcie");
  EXPECT_EQ(d.address, "0000:00:04.0");
  EXPECT_EQ(d.capacity_bytes, 1ull << 30);
}

TEST_F(FakeSysfs, PartitionResolvesToItsDisk) {
  AddNvme(0, "0000:00:04.0", "259:0");
  Link("dev/block/259:1",
       "../../devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p1");
  auto dev = ResolveBlockDevice(root_.string(), 259, 1);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(dev->block_device, "nvme0n1p1");
  ASSERT_EQ(dev->disks.size(), 1u);
  EXPECT_EQ(dev->disks[0].name, "nvme0n1");
  EXPECT_EQ(dev->disks[0].controller, "nvme0");
}

TEST_F(FakeSysfs, MultipathNamespaceFindsTheFirstControllerOfItsSubsystem) {
  const std::string subsys = "devices/virtual/nvme-subsystem/nvme-subsys0";
  Write(subsys + "/nvme0n1/size", "2048");
  Link(subsys + "/nvme0n1/device", "../../nvme-subsys0");
  Write("devices/pci0000:00/0000:00:05.0/nvme/nvme1/model", "Vendor X");
  Write("devices/pci0000:00/0000:00:04.0/nvme/nvme0/model", "Vendor Y");
  Link(subsys + "/nvme1", "../../../pci0000:00/0000:00:05.0/nvme/nvme1");
  Link(subsys + "/nvme0", "../../../pci0000:00/0000:00:04.0/nvme/nvme0");
  Link("dev/block/259:3", "../../" + subsys + "/nvme0n1");
  auto dev = ResolveBlockDevice(root_.string(), 259, 3);
  ASSERT_TRUE(dev.ok()) << dev.status();
  ASSERT_EQ(dev->disks.size(), 1u);
  EXPECT_TRUE(dev->disks[0].nvme);
  EXPECT_EQ(dev->disks[0].nsid, 1u) << "from the name where sysfs has no nsid";
  EXPECT_EQ(dev->disks[0].controller, "nvme0");
  EXPECT_EQ(dev->disks[0].model, "Vendor Y");
}

TEST_F(FakeSysfs, VirtioDiskIsSaidPlainlyNotToBeNvme) {
  const std::string vda = "devices/pci0000:00/0000:00:02.0/virtio1/block/vda";
  Write(vda + "/size", "528424168");
  Write("bus/virtio/drivers/virtio_blk/uevent", "");
  Link(vda + "/device", "../../../virtio1");
  Link("devices/pci0000:00/0000:00:02.0/virtio1/driver", "../../../../bus/virtio/drivers/virtio_blk");
  Link("dev/block/254:0", "../../" + vda);
  auto dev = ResolveBlockDevice(root_.string(), 254, 0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(dev->block_device, "vda");
  ASSERT_EQ(dev->disks.size(), 1u);
  EXPECT_FALSE(dev->disks[0].nvme);
  EXPECT_EQ(dev->disks[0].kind, "virtio block device");
  EXPECT_EQ(dev->not_nvme, "not on NVMe (virtio block device vda)");
}

TEST_F(FakeSysfs, DeviceMapperLeadsToTheNamespacesBeneath) {
  AddNvme(0, "0000:00:04.0", "259:0");
  AddNvme(1, "0000:00:05.0", "259:2");
  const std::string dm = "devices/virtual/block/dm-0";
  Write(dm + "/size", "4190208");
  Link(dm + "/slaves/nvme0n1p1", "../../../../pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p1");
  Link(dm + "/slaves/nvme1n1", "../../../../pci0000:00/0000:00:05.0/nvme/nvme1/nvme1n1");
  Link("dev/block/253:0", "../../" + dm);
  auto dev = ResolveBlockDevice(root_.string(), 253, 0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(dev->block_device, "dm-0");
  ASSERT_EQ(dev->disks.size(), 2u);
  EXPECT_EQ(dev->disks[0].name, "nvme0n1");
  EXPECT_EQ(dev->disks[1].name, "nvme1n1");
  EXPECT_EQ(dev->disks[1].controller, "nvme1");
  EXPECT_EQ(dev->not_nvme, "");
}

TEST_F(FakeSysfs, NoSysfsEntryIsAVirtualFileSystem) {
  auto dev = ResolveBlockDevice(root_.string(), 0, 45);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_TRUE(dev->block_device.empty());
  EXPECT_TRUE(dev->disks.empty());
  EXPECT_NE(dev->not_nvme.find("not on a block device (device 0:45"), std::string::npos)
      << dev->not_nvme;
}

TEST(DeviceOfDir, MissingDirectoryIsNotFound) {
  auto dev = DeviceOfDir("/nonexistent/tutti/pool");
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(dev.status().message().find("No such file"), std::string::npos) << dev.status();
}

TEST(ReadNvmeHealth, MissingControllerIsNotFound) {
  auto h = ReadNvmeHealth("/nonexistent-dev", "nvme0", 1);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kNotFound) << h.status();
}

TEST(CriticalWarnings, NamesEachSetBit) {
  EXPECT_TRUE(CriticalWarnings(0).empty());
  const std::vector<std::string> w = CriticalWarnings(0x05);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0], "available spare below threshold");
  EXPECT_EQ(w[1], "reliability degraded (media or internal errors)");
}

}  // namespace
}  // namespace tutti::tuttictl
