#include "daemon/server/device_health.h"

#include "gtest/gtest.h"

namespace tutti::server {
namespace {

DeviceHealth Dev(const std::string& name, uint32_t warning) {
  DeviceHealth d;
  d.device = name;
  d.model = "QEMU NVMe Ctrl";
  d.serial = "deadbeef";
  d.critical_warning = warning;
  return d;
}

TEST(DeviceHealthTest, LatestReportPerDeviceIsKept) {
  DeviceHealthBoard board;
  EXPECT_TRUE(board.Snapshot().empty());
  board.Update({Dev("nvme0n1", 0), Dev("nvme1n1", 0)});
  board.Update({Dev("nvme1n1", 4)});
  const std::vector<DeviceHealth> s = board.Snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].device, "nvme0n1");
  EXPECT_EQ(s[0].critical_warning, 0u);
  EXPECT_EQ(s[1].device, "nvme1n1");
  EXPECT_EQ(s[1].critical_warning, 4u);
}

TEST(DeviceHealthTest, WarningBitsInWords) {
  EXPECT_EQ(CriticalWarningText(0), "none");
  EXPECT_EQ(CriticalWarningText(4), "reliability degraded (media or internal errors)");
  EXPECT_EQ(CriticalWarningText(1 | 8), "available spare below threshold, read-only");
  EXPECT_EQ(CriticalWarningText(0x80), "unknown bits");
}

}  // namespace
}  // namespace tutti::server
