#include "client/hostengine/kv_shape.h"

#include "gtest/gtest.h"

namespace tutti::hostengine {
namespace {

TEST(KvShapeTest, Llama3Defaults) {
  const KvShape s = KvShape::Llama3_8B();
  EXPECT_TRUE(s.Validate().ok());
  EXPECT_EQ(s.object_len(), 32u * 1024);
  EXPECT_EQ(s.num_objects(), 64u);
  EXPECT_EQ(s.block_bytes(), 2u << 20);
  EXPECT_EQ(s.region_bytes(256), 512ull << 20);
}

TEST(KvShapeTest, FusedPlacementsFollowVllmTensor) {
  const KvShape s = KvShape::Llama3_8B();
  const uint32_t n = 10;
  const auto placements = s.Placements(n);
  ASSERT_EQ(placements.size(), 64u);
  for (uint32_t l = 0; l < s.layers; ++l) {
    for (uint32_t p = 0; p < 2; ++p) {
      const auto& pl = placements[l * 2 + p];
      EXPECT_EQ(pl.region(), 0u);
      EXPECT_EQ(pl.offset(), l * s.layer_bytes(n) + p * n * s.object_len());
      EXPECT_EQ(pl.block_stride(), s.object_len());
      // The placement formula and ObjectOffset agree for every block.
      EXPECT_EQ(pl.offset() + 7 * pl.block_stride(), s.ObjectOffset(n, 7, l, p));
    }
  }
  // The last object of the last block ends exactly at the end of the region.
  EXPECT_EQ(s.ObjectOffset(n, n - 1, s.layers - 1, 1) + s.object_len(), s.region_bytes(n));
}

TEST(KvShapeTest, MlaHasOnePart) {
  KvShape s;
  s.format = tutti::v1::KV_FORMAT_MLA;
  s.kv_heads = 1;
  s.head_dim = 576;
  EXPECT_EQ(s.parts(), 1u);
  EXPECT_EQ(s.num_objects(), 32u);
  EXPECT_EQ(s.Placements(4).size(), 32u);
}

TEST(KvShapeTest, ValidateNamesTheField) {
  KvShape s;
  s.head_dim = 0;
  EXPECT_NE(s.Validate().message().find("head_dim"), std::string::npos);
  s = KvShape();
  s.format = tutti::v1::KV_FORMAT_UNSPECIFIED;
  EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvShapeTest, ToProto) {
  const auto p = KvShape::Llama3_8B().ToProto();
  EXPECT_EQ(p.num_layers(), 32u);
  EXPECT_EQ(p.kv_heads(), 8u);
  EXPECT_EQ(p.head_dim(), 128u);
  EXPECT_EQ(p.dtype_bytes(), 2u);
  EXPECT_EQ(p.block_tokens(), 16u);
  EXPECT_EQ(p.format(), tutti::v1::KV_FORMAT_FUSED);
}

}  // namespace
}  // namespace tutti::hostengine
