#include "daemon/engine/placement.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::engine {
namespace {

using ::testing::HasSubstr;

void ExpectInvalid(const absl::Status& s, const std::string& part) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(part));
}

TEST(PlacementTest, ExactFitIsAcceptedOneByteMoreIsNot) {
  // 4 blocks of 2 objects of 100 bytes, fused per block: stride 200, object 1 at offset 100.
  std::vector<ObjectPlacement> p = {{0, 0, 200}, {0, 100, 200}};
  EXPECT_TRUE(ValidatePlacements({800}, p, 4, 2, 100).ok());
  ExpectInvalid(ValidatePlacements({799}, p, 4, 2, 100), "placements[1]");
}

TEST(PlacementTest, RegionIndexMustExist) {
  std::vector<ObjectPlacement> p = {{0, 0, 100}, {2, 0, 100}};
  ExpectInvalid(ValidatePlacements({1000, 1000}, p, 2, 2, 100), "placements[1].region = 2");
}

TEST(PlacementTest, CountMustMatchObjects) {
  std::vector<ObjectPlacement> p = {{0, 0, 100}};
  ExpectInvalid(ValidatePlacements({1000}, p, 2, 2, 100), "placements: 1 given");
}

TEST(PlacementTest, OverflowIsCaught) {
  std::vector<ObjectPlacement> big_stride = {{0, 0, UINT64_MAX / 2}};
  ExpectInvalid(ValidatePlacements({UINT64_MAX}, big_stride, 4, 1, 100), "placements[0]");
  std::vector<ObjectPlacement> big_offset = {{0, UINT64_MAX - 10, 100}};
  ExpectInvalid(ValidatePlacements({UINT64_MAX}, big_offset, 1, 1, 100), "placements[0]");
}

TEST(PlacementTest, OverlappingBlocksAreRejected) {
  std::vector<ObjectPlacement> p = {{0, 0, 50}};
  ExpectInvalid(ValidatePlacements({1000}, p, 2, 1, 100), "block_stride");
  // One block: the stride is never used.
  std::vector<ObjectPlacement> one = {{0, 0, 0}};
  EXPECT_TRUE(ValidatePlacements({100}, one, 1, 1, 100).ok());
}

TEST(PlacementTest, EmptyShapesAreRejected) {
  std::vector<ObjectPlacement> p = {{0, 0, 100}};
  ExpectInvalid(ValidatePlacements({1000}, p, 0, 1, 100), "num_blocks");
  ExpectInvalid(ValidatePlacements({1000}, p, 1, 1, 0), "objects");
}

}  // namespace
}  // namespace tutti::engine
