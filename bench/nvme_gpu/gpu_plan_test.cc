#include "bench/nvme_gpu/gpu_plan.h"

#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::io::nvme::gpu {
namespace {

constexpr uint32_t kObject = 32768;
constexpr uint32_t kParts = 2;
constexpr uint64_t kFileLbas = 1u << 20;  // file f starts at LBA f * kFileLbas

pool::Location Locate(uint64_t slot, uint32_t object) {
  // file = part; the layer's objects of consecutive slots side by side (they merge).
  return pool::Location{object % kParts, (uint64_t{object / kParts} * 1000 + slot) * kObject};
}
uint64_t LbaOfFile(uint32_t file, uint64_t offset) { return file * kFileLbas + offset / 4096; }
uint64_t Destination(uint32_t item, uint32_t part) {
  return (uint64_t{item} * kParts + part) * kObject * 3;  // engine blocks, not contiguous
}

// Every object of the layer is one piece, whose bytes come from the object's LBAs and go to its
// engine block.
TEST(GpuPlanTest, EveryObjectLandsInItsEngineBlockFromItsLbas) {
  std::vector<datapath::PlanItem> items;
  for (uint64_t s = 0; s < 40; ++s) items.push_back(datapath::PlanItem{s});
  items[7].slot.reset();  // served elsewhere: not read
  const uint32_t layer = 3;
  const datapath::LayerPlan lp = datapath::PlanLayerAt(
      Locate, kObject, datapath::PlanRequest{items, layer, kParts, kObject, 1u << 18});
  ASSERT_GT(lp.ios.size(), 2u);  // merged, and split at 256 KiB
  GpuPlan plan;
  ASSERT_TRUE(AppendLayerPlan(lp, layer, kObject, 12, LbaOfFile, Destination, &plan).ok());
  EXPECT_EQ(plan.num_layers, layer + 1);
  ASSERT_EQ(plan.ios.size(), lp.ios.size());
  std::map<uint64_t, uint64_t> lba_of_dst;  // destination -> first LBA of its bytes
  for (const GpuReadIo& io : plan.ios) {
    EXPECT_EQ(io.layer, layer);
    EXPECT_LE(io.blocks * 4096u, 1u << 18);
    for (uint32_t k = 0; k < io.num_pieces; ++k) {
      const GpuPiece& p = plan.pieces[io.first_piece + k];
      EXPECT_EQ(p.len, kObject);
      EXPECT_LE(p.src_offset + p.len, io.blocks * 4096u);
      EXPECT_TRUE(lba_of_dst.emplace(p.dst_offset, io.slba + p.src_offset / 4096).second);
    }
  }
  EXPECT_EQ(lba_of_dst.size(), 39u * kParts);
  for (uint32_t item = 0; item < 40; ++item) {
    for (uint32_t part = 0; part < kParts; ++part) {
      auto it = lba_of_dst.find(Destination(item, part));
      if (item == 7) {
        EXPECT_EQ(it, lba_of_dst.end());
        continue;
      }
      ASSERT_NE(it, lba_of_dst.end()) << item << "/" << part;
      const pool::Location want = Locate(item, layer * kParts + part);
      EXPECT_EQ(it->second, LbaOfFile(want.file, want.offset)) << item << "/" << part;
    }
  }
}

TEST(GpuPlanTest, LayersAppendAndPiecesIndexTheWholePlan) {
  std::vector<datapath::PlanItem> items{datapath::PlanItem{0}, datapath::PlanItem{5}};
  GpuPlan plan;
  for (uint32_t layer : {0u, 1u}) {
    const datapath::LayerPlan lp = datapath::PlanLayerAt(
        Locate, kObject, datapath::PlanRequest{items, layer, kParts, kObject, 1u << 20});
    ASSERT_TRUE(AppendLayerPlan(lp, layer, kObject, 12, LbaOfFile, Destination, &plan).ok());
  }
  EXPECT_EQ(plan.num_layers, 2u);
  EXPECT_EQ(plan.pieces.size(), 8u);
  uint32_t next = 0;
  for (const GpuReadIo& io : plan.ios) {
    EXPECT_EQ(io.first_piece, next);
    next += io.num_pieces;
  }
  EXPECT_EQ(next, 8u);
}

TEST(GpuPlanTest, RefusesWhatTheKernelCannotMove) {
  std::vector<datapath::PlanItem> items{datapath::PlanItem{0}};
  const datapath::LayerPlan lp = datapath::PlanLayerAt(
      Locate, kObject, datapath::PlanRequest{items, 0, kParts, kObject, 1u << 20});
  GpuPlan plan;
  // 64 KiB "LBAs" do not divide a 32 KiB I/O.
  EXPECT_EQ(AppendLayerPlan(lp, 0, kObject, 16, LbaOfFile, Destination, &plan).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AppendLayerPlan(lp, 0, kObject - 8, 12, LbaOfFile, Destination, &plan).code(),
            absl::StatusCode::kInvalidArgument);
  auto odd = [](uint32_t, uint32_t) -> uint64_t { return 8; };
  EXPECT_EQ(AppendLayerPlan(lp, 0, kObject, 12, LbaOfFile, odd, &plan).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(plan.ios.empty());
  EXPECT_TRUE(plan.pieces.empty());
}

}  // namespace
}  // namespace tutti::io::nvme::gpu
