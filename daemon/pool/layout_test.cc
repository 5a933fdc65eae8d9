#include "daemon/pool/layout.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::pool {
namespace {

uint64_t DivUp(uint64_t v, uint64_t d) { return (v + d - 1) / d; }
uint64_t RoundUp(uint64_t v, uint64_t a) { return DivUp(v, a) * a; }

// The file size a pool of `extents` extents of G = `g` needs, computed independently of
// layout.cc: headers of S / D = extents * g slots, then M * g frames per extent.
uint64_t FileBytesFor(uint64_t extents, uint32_t g, uint32_t obj, uint32_t objs) {
  const uint64_t headers = RoundUp(kSuperblockBytes + extents * g * kSlotHeaderBytes,
                                   kFrameAreaAlign);
  return headers + extents * g * objs * uint64_t{obj};
}

// By counting up, no stepping: the most extents of G = g that fit in cap / files.
uint64_t MaxExtents(uint64_t cap, uint32_t files, uint32_t g, uint32_t obj, uint32_t objs) {
  uint64_t x = 0;
  while (FileBytesFor(x + 1, g, obj, objs) <= cap / files) ++x;
  return x;
}

// The G a pool should get: the largest g <= wanted with at least kMinExtents extents, else 1.
uint32_t ExpectedG(uint64_t cap, uint32_t files, uint32_t wanted, uint32_t obj, uint32_t objs) {
  for (uint32_t g = wanted; g > 1; --g) {
    if (MaxExtents(cap, files, g, obj, objs) >= kMinExtents) return g;
  }
  return 1;
}

// Contiguous runs among `locs` (sorted, then merged where one frame ends where the next starts).
size_t CountRuns(std::vector<Location> locs, uint32_t obj) {
  std::sort(locs.begin(), locs.end(), [](const Location& a, const Location& b) {
    return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
  });
  size_t runs = 0;
  for (size_t i = 0; i < locs.size(); ++i) {
    runs += i == 0 || locs[i].file != locs[i - 1].file ||
            locs[i].offset != locs[i - 1].offset + obj;
  }
  return runs;
}

TEST(PoolLayoutTest, RejectsBadArgumentsNamingTheField) {
  auto bad = [](uint64_t cap, uint32_t files, uint32_t obj, uint32_t objs, uint32_t g,
                const char* field) {
    auto l = PoolLayout::Compute(cap, files, obj, objs, g);
    ASSERT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(l.status().message().find(field), std::string::npos) << l.status();
  };
  bad(1 << 30, 1, 0, 64, 0, "object_bytes");
  bad(1 << 30, 1, 1000, 64, 0, "object_bytes");
  bad(1 << 30, 1, 32768, 0, 0, "max_objects");
  bad(1 << 30, 1, 32768, kMaxObjectsPerSlot + 1, 0, "max_objects");
  bad(1 << 30, 1, 32768, 64, kMaxExtentSlots + 1, "extent_slots");
  bad(1 << 30, 0, 32768, 64, 0, "dirs");
  bad(2 << 20, 1, 32768, 64, 0, "capacity_bytes");  // 1 MiB of headers + one 2 MiB slot > 2 MiB
}

TEST(PoolLayoutTest, TinyPerFileCapacityIsAnErrorNotAWrappedCount) {
  // 100 files of 640 KiB each: the 1 MiB header area alone does not fit.
  auto l = PoolLayout::Compute(64ull << 20, 100, 4096, 1);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << l->num_slots();
}

TEST(PoolLayoutTest, OneGibOneFileLlamaBlocksAutoExtent) {
  // 32 KiB objects, 64 per slot: G = 1 MiB / 32 KiB = 32, an extent is 32 slots, 64 MiB of
  // frames. 15 extents (480 slots, 480 headers: 2 MiB with the superblock, rounded) fit in 1 GiB.
  auto l = PoolLayout::Compute(1ull << 30, 1, 32768, 64);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->extent_slots(), 32u);
  EXPECT_EQ(l->slots_per_extent(), 32u);
  EXPECT_EQ(l->num_slots(), 480u);
  EXPECT_EQ(l->num_extents(), 15u);
  EXPECT_EQ(l->file_bytes(), (2u << 20) + 15 * (64ull << 20));
  EXPECT_EQ(l->slot_bytes(), (2u << 20) + 4096);
  EXPECT_EQ(l->ObjectLocation(0, 0).offset, 2u << 20);
  EXPECT_EQ(l->ObjectLocation(1, 0).offset, (2u << 20) + 32768) << "next slot, same object";
  EXPECT_EQ(l->ObjectLocation(0, 1).offset, (3u << 20)) << "next object: after G frames";
  EXPECT_EQ(l->ObjectLocation(32, 0).offset, (66u << 20)) << "next extent";
  EXPECT_EQ(l->HeaderLocation(479).offset, 4096u + 479 * 4096);
}

TEST(PoolLayoutTest, OneSlotExtentsOnOneFileAreFormatOnesLayout) {
  // The benchmark's "before": G = 1, D = 1 puts object j of slot s at frame s * M + j.
  auto l = PoolLayout::Compute(1ull << 30, 1, 32768, 64, 1);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->extent_slots(), 1u);
  EXPECT_EQ(l->num_slots(), 511u) << "as many as format 1 held";
  EXPECT_EQ(l->file_bytes(), 1ull << 30);
  for (uint64_t s : {0ull, 1ull, 77ull, 510ull}) {
    for (uint32_t j = 0; j < 64; ++j) {
      EXPECT_EQ(l->ObjectLocation(s, j).offset, (2u << 20) + (s * 64 + j) * 32768);
    }
  }
}

TEST(PoolLayoutTest, FourFilesGroupsTurnOverTheFiles) {
  auto l = PoolLayout::Compute(4ull << 30, 4, 32768, 64, 8);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->extent_slots(), 8u);
  EXPECT_EQ(l->slots_per_extent(), 32u);
  const uint64_t frame_area = l->ObjectLocation(0, 0).offset;
  // Slot 45: extent 1, index 13, group 1, position 5.
  for (uint32_t j = 0; j < 64; ++j) {
    const Location loc = l->ObjectLocation(45, j);
    EXPECT_EQ(loc.file, (1 + j) % 4);
    EXPECT_EQ(loc.offset, frame_area + (1 * 64 * 8 + j * 8 + 5) * 32768);
  }
  EXPECT_EQ(l->HeaderLocation(45).file, 1u);
  EXPECT_EQ(l->HeaderLocation(45).offset, 4096u + 11 * 4096);
  // One layer (objects 6, 7) of 32 consecutive slots (one extent): one run of 16 frames per
  // file, object 6 of group g followed by object 7 of group g - 1.
  std::vector<Location> layer;
  std::vector<int> per_file(4);
  for (uint64_t s = 32; s < 64; ++s) {
    for (uint32_t j : {6u, 7u}) {
      layer.push_back(l->ObjectLocation(s, j));
      ++per_file[layer.back().file];
    }
  }
  EXPECT_EQ(per_file, (std::vector<int>{16, 16, 16, 16}));
  EXPECT_EQ(CountRuns(layer, 32768), 4u);
}

TEST(PoolLayoutTest, OneFileALayerOfAWholeGroupIsOneRun) {
  // D = 1: K (object 2l) and V (2l + 1) of a group's G slots are 2G adjacent frames.
  auto l = PoolLayout::Compute(1ull << 30, 1, 32768, 64, 4);
  ASSERT_TRUE(l.ok());
  std::vector<Location> layer;
  for (uint64_t s = 8; s < 12; ++s) {
    for (uint32_t j : {10u, 11u}) layer.push_back(l->ObjectLocation(s, j));
  }
  EXPECT_EQ(CountRuns(layer, 32768), 1u);
  layer.pop_back();  // slot 11's V: K and V of slots 8..11 minus one frame inside the run
  layer.erase(layer.begin() + 1);  // slot 8's V
  EXPECT_EQ(CountRuns(layer, 32768), 2u);
}

// Checks every invariant of one layout exhaustively.
void CheckLayout(uint64_t cap, uint32_t files, uint32_t obj, uint32_t objs, uint32_t wanted_g) {
  SCOPED_TRACE(testing::Message() << "cap=" << cap << " files=" << files << " obj=" << obj
                                  << " objs=" << objs << " g=" << wanted_g);
  auto l = PoolLayout::Compute(cap, files, obj, objs, wanted_g);
  if (!l.ok()) {
    // Only when not even one extent of one-slot groups fits.
    EXPECT_EQ(MaxExtents(cap, files, 1, obj, objs), 0u);
    return;
  }
  const uint32_t want = wanted_g != 0 ? wanted_g : std::max<uint32_t>(1, (1 << 20) / obj);
  const uint32_t g = ExpectedG(cap, files, want, obj, objs);
  ASSERT_EQ(l->extent_slots(), g);
  const uint64_t extents = MaxExtents(cap, files, g, obj, objs);
  const uint64_t slots = l->num_slots();
  ASSERT_EQ(slots, extents * g * files) << "whole extents, as many as fit";
  EXPECT_EQ(l->num_extents(), extents);
  EXPECT_LE(uint64_t{files} * l->file_bytes(), cap);
  EXPECT_EQ(l->file_bytes(), FileBytesFor(extents, g, obj, objs));
  EXPECT_LE(slots * l->slot_bytes(), cap);

  const uint64_t header_end = kSuperblockBytes + slots / files * kSlotHeaderBytes;
  const uint64_t frame_area = RoundUp(header_end, kFrameAreaAlign);
  std::set<std::pair<uint32_t, uint64_t>> frames, headers;
  for (uint64_t s = 0; s < slots; ++s) {
    const Location h = l->HeaderLocation(s);
    EXPECT_EQ(h.file, s % files);
    EXPECT_EQ(h.offset % kBlockAlign, 0u);
    EXPECT_GE(h.offset, kSuperblockBytes);
    EXPECT_LE(h.offset + kSlotHeaderBytes, header_end);
    EXPECT_TRUE(headers.insert({h.file, h.offset}).second) << "header of slot " << s << " reused";
    std::vector<int> per_file(files);
    const bool next_in_group = s + 1 < slots && (s + 1) / g == s / g;
    for (uint32_t j = 0; j < objs; ++j) {
      const Location o = l->ObjectLocation(s, j);
      ASSERT_LT(o.file, files);
      EXPECT_EQ(o.offset % kBlockAlign, 0u);
      EXPECT_GE(o.offset, frame_area);
      EXPECT_LE(o.offset + obj, l->file_bytes());
      // Frames are object-sized steps from the frame area: distinct offsets cannot overlap.
      EXPECT_EQ((o.offset - frame_area) % obj, 0u);
      EXPECT_TRUE(frames.insert({o.file, o.offset}).second)
          << "slot " << s << " object " << j << " shares a frame";
      ++per_file[o.file];
      if (next_in_group) {
        const Location n = l->ObjectLocation(s + 1, j);
        EXPECT_EQ(n.file, o.file) << "slot " << s << " object " << j;
        EXPECT_EQ(n.offset, o.offset + obj) << "slot " << s << " object " << j;
      }
    }
    const auto [lo, hi] = std::minmax_element(per_file.begin(), per_file.end());
    EXPECT_LE(*hi - *lo, 1) << "objects of slot " << s << " not spread evenly";
  }
  EXPECT_EQ(frames.size(), (l->file_bytes() - frame_area) / obj * files) << "every frame used";
}

TEST(PoolLayoutTest, InvariantsHoldOverManyShapes) {
  for (uint32_t files : {1u, 2u, 3u, 4u, 7u}) {
    for (uint32_t obj : {4096u, 12288u, 65536u}) {
      for (uint32_t objs : {1u, 2u, 5u, 64u}) {
        for (uint32_t g : {0u, 1u, 2u, 3u, 8u}) {
          for (uint64_t cap : {3ull << 20, 5ull << 20, 9ull << 20, 33ull << 20}) {
            CheckLayout(cap * files + 12345, files, obj, objs, g);
          }
        }
      }
    }
  }
}

TEST(PoolLayoutTest, OneObjectOfConsecutiveSlotsTakesOneRunPerGroupTouched) {
  // For M >= 2, object j of slots [s0, s0 + n) takes one run per group touched:
  // s / G over the range, as groups never continue on the same file.
  for (uint32_t files : {1u, 2u, 3u}) {
    for (uint32_t g : {1u, 2u, 5u}) {
      auto l = PoolLayout::Compute(64ull << 20, files, 4096, 3, g);
      ASSERT_TRUE(l.ok());
      ASSERT_EQ(l->extent_slots(), g);
      const uint64_t slots = std::min<uint64_t>(l->num_slots(), 60);
      for (uint64_t s0 = 0; s0 < slots; ++s0) {
        for (uint64_t n = 1; s0 + n <= slots; ++n) {
          for (uint32_t j = 0; j < 3; ++j) {
            std::vector<Location> locs;
            for (uint64_t s = s0; s < s0 + n; ++s) locs.push_back(l->ObjectLocation(s, j));
            ASSERT_EQ(CountRuns(locs, 4096), (s0 + n - 1) / g - s0 / g + 1)
                << "files " << files << " g " << g << " s0 " << s0 << " n " << n << " j " << j;
          }
        }
      }
    }
  }
}

TEST(PoolLayoutTest, SlotCountIsMaximalAcrossHeaderRoundingSteps) {
  // Sweep capacities around the points where the header area crosses 1 MiB steps.
  for (uint64_t cap = (1ull << 30) - (8 << 20); cap <= (1ull << 30) + (8 << 20); cap += 4096 * 37) {
    for (uint32_t g : {1u, 4u}) {
      auto l = PoolLayout::Compute(cap, 1, 32768, 64, g);
      ASSERT_TRUE(l.ok());
      ASSERT_EQ(l->extent_slots(), g);
      EXPECT_LE(l->file_bytes(), cap);
      EXPECT_GT(FileBytesFor(l->num_extents() + 1, g, 32768, 64), cap) << cap;
    }
  }
}

TEST(PoolLayoutTest, SmallPoolsLowerTheExtentSlots) {
  // 64 MiB over 2 files of 4 KiB x 8 objects: G = 256 would need 8 MiB per extent and file
  // (3 fit); G = 112 (3.5 MiB) is the largest that gives 8 extents with their 4 MiB of headers.
  auto l = PoolLayout::Compute(64ull << 20, 2, 4096, 8);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->extent_slots(), 112u);
  EXPECT_EQ(l->num_extents(), 8u);
  EXPECT_EQ(l->num_slots(), 8u * 112 * 2);
  EXPECT_EQ(l->file_bytes(), 32ull << 20);
  // Too small for kMinExtents even with G = 1: G = 1 and as many extents as fit.
  auto tiny = PoolLayout::Compute(4ull << 20, 1, 1 << 20, 1, 16);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->extent_slots(), 1u);
  EXPECT_EQ(tiny->num_slots(), 3u);
}

}  // namespace
}  // namespace tutti::pool
