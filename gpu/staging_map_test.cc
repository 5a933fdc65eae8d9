#include "gpu/staging_map.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

uint8_t* Addr(uint64_t v) { return reinterpret_cast<uint8_t*>(v); }

TEST(StagingMapTest, TranslatesInsideRegionsOnly) {
  std::vector<StagingRegion> regions = {{Addr(0x100000), 0x1000, Addr(0x9000000)},
                                        {Addr(0x200000), 0x2000, Addr(0xa000000)}};
  absl::StatusOr<StagingMap> map = StagingMap::Create(regions);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->ToDevice(Addr(0x100010), 16), Addr(0x9000010));
  EXPECT_EQ(map->ToDevice(Addr(0x201000), 0x1000), Addr(0xa001000));
  EXPECT_EQ(map->ToDevice(Addr(0x201000), 0x1001), nullptr);  // runs past the end
  EXPECT_EQ(map->ToDevice(Addr(0x0fff00), 16), nullptr);      // before every region
  EXPECT_EQ(map->ToDevice(Addr(0x101000), 16), nullptr);      // between regions
}

TEST(StagingMapTest, RejectsOverlapAndMisalignment) {
  std::vector<StagingRegion> overlap = {{Addr(0x100000), 0x2000, Addr(0x9000000)},
                                        {Addr(0x101000), 0x1000, Addr(0xa000000)}};
  EXPECT_EQ(StagingMap::Create(overlap).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<StagingRegion> unaligned = {{Addr(0x100008), 0x1000, Addr(0x9000000)}};
  EXPECT_EQ(StagingMap::Create(unaligned).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti::gpu
