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

// The file size a pool of `slots` slots needs, computed independently of layout.cc.
uint64_t FileBytesFor(uint64_t slots, uint32_t files, uint32_t object_bytes, uint32_t objects) {
  const uint64_t headers =
      RoundUp(kSuperblockBytes + DivUp(slots, files) * kSlotHeaderBytes, kFrameAreaAlign);
  return headers + slots * DivUp(objects, files) * object_bytes;
}

TEST(PoolLayoutTest, RejectsBadArgumentsNamingTheField) {
  auto bad = [](uint64_t cap, uint32_t files, uint32_t obj, uint32_t objs, const char* field) {
    auto l = PoolLayout::Compute(cap, files, obj, objs);
    ASSERT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(l.status().message().find(field), std::string::npos) << l.status();
  };
  bad(1 << 30, 1, 0, 64, "object_bytes");
  bad(1 << 30, 1, 1000, 64, "object_bytes");
  bad(1 << 30, 1, 32768, 0, "max_objects");
  bad(1 << 30, 1, 32768, kMaxObjectsPerSlot + 1, "max_objects");
  bad(1 << 30, 0, 32768, 64, "dirs");
  bad(2 << 20, 1, 32768, 64, "capacity_bytes");  // 1 MiB of headers + one 2 MiB slot > 2 MiB
}

TEST(PoolLayoutTest, TinyPerFileCapacityIsAnErrorNotAWrappedCount) {
  // 100 files of 640 KiB each: the 1 MiB header area alone does not fit.
  auto l = PoolLayout::Compute(64ull << 20, 100, 4096, 1);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << l->num_slots();
}

TEST(PoolLayoutTest, OneGibOneFileLlamaBlocks) {
  // 32 KiB objects, 64 per slot: 2 MiB a slot. 511 slots need 511 headers (2 MiB with the
  // superblock, exactly) and 1022 MiB of frames: 1 GiB in all.
  auto l = PoolLayout::Compute(1ull << 30, 1, 32768, 64);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->num_slots(), 511u);
  EXPECT_EQ(l->file_bytes(), 1ull << 30);
  EXPECT_EQ(l->slot_bytes(), (2u << 20) + 4096);
  EXPECT_EQ(l->ObjectLocation(0, 0).offset, 2u << 20);
  EXPECT_EQ(l->ObjectLocation(0, 1).offset, (2u << 20) + 32768);
  EXPECT_EQ(l->ObjectLocation(1, 0).offset, (4u << 20));
  EXPECT_EQ(l->HeaderLocation(510).offset, 4096u + 510 * 4096);
}

TEST(PoolLayoutTest, FourFilesStripeRoundRobin) {
  auto l = PoolLayout::Compute(4ull << 30, 4, 32768, 64);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->num_files(), 4u);
  // Object j of slot s lives in file (s + j) % 4; 16 frames per slot in each file.
  for (uint64_t s : {0ull, 1ull, 7ull}) {
    for (uint32_t j = 0; j < 64; ++j) {
      const Location loc = l->ObjectLocation(s, j);
      EXPECT_EQ(loc.file, (s + j) % 4);
      const uint64_t frame_area = l->ObjectLocation(0, 0).offset;
      EXPECT_EQ(loc.offset, frame_area + (s * 16 + j / 4) * 32768);
    }
    EXPECT_EQ(l->HeaderLocation(s).file, s % 4);
  }
  // One layer (objects 2l, 2l+1) of 4 consecutive slots touches every file twice.
  std::vector<int> per_file(4);
  for (uint64_t s = 10; s < 14; ++s) {
    for (uint32_t j : {6u, 7u}) ++per_file[l->ObjectLocation(s, j).file];
  }
  EXPECT_EQ(per_file, (std::vector<int>{2, 2, 2, 2}));
}

// Checks every invariant of one layout exhaustively.
void CheckLayout(uint64_t cap, uint32_t files, uint32_t obj, uint32_t objs) {
  SCOPED_TRACE(testing::Message() << "cap=" << cap << " files=" << files << " obj=" << obj
                                  << " objs=" << objs);
  auto l = PoolLayout::Compute(cap, files, obj, objs);
  if (!l.ok()) {
    // Only when not even one slot fits.
    EXPECT_GT(FileBytesFor(1, files, obj, objs), cap / files);
    return;
  }
  const uint64_t slots = l->num_slots();
  // The files never exceed the capacity, and the pool is the largest that fits.
  EXPECT_LE(uint64_t{files} * l->file_bytes(), cap);
  EXPECT_EQ(l->file_bytes(), FileBytesFor(slots, files, obj, objs));
  EXPECT_GT(FileBytesFor(slots + 1, files, obj, objs), cap / files) << "one more slot fits";
  EXPECT_LE(slots * l->slot_bytes(), cap);

  const uint64_t header_end = kSuperblockBytes + DivUp(slots, files) * kSlotHeaderBytes;
  std::set<std::pair<uint32_t, uint64_t>> frames, headers;
  for (uint64_t s = 0; s < slots; ++s) {
    const Location h = l->HeaderLocation(s);
    EXPECT_LT(h.file, files);
    EXPECT_EQ(h.offset % kBlockAlign, 0u);
    EXPECT_GE(h.offset, kSuperblockBytes);
    EXPECT_LE(h.offset + kSlotHeaderBytes, header_end);
    EXPECT_TRUE(headers.insert({h.file, h.offset}).second) << "header of slot " << s << " reused";
    std::vector<int> per_file(files);
    for (uint32_t j = 0; j < objs; ++j) {
      const Location o = l->ObjectLocation(s, j);
      ASSERT_EQ(o.file, (s + j) % files) << "slot " << s << " object " << j;
      EXPECT_EQ(o.offset % kBlockAlign, 0u);
      EXPECT_GE(o.offset, RoundUp(header_end, kFrameAreaAlign));
      EXPECT_LE(o.offset + obj, l->file_bytes());
      // Frames are object-sized steps from the frame area: distinct offsets cannot overlap.
      EXPECT_EQ((o.offset - RoundUp(header_end, kFrameAreaAlign)) % obj, 0u);
      EXPECT_TRUE(frames.insert({o.file, o.offset}).second)
          << "slot " << s << " object " << j << " shares a frame";
      ++per_file[o.file];
    }
    const auto [lo, hi] = std::minmax_element(per_file.begin(), per_file.end());
    EXPECT_LE(*hi - *lo, 1) << "objects of slot " << s << " not spread evenly";
  }
}

TEST(PoolLayoutTest, InvariantsHoldOverManyShapes) {
  for (uint32_t files : {1u, 2u, 3u, 4u, 7u}) {
    for (uint32_t obj : {4096u, 12288u, 65536u}) {
      for (uint32_t objs : {1u, 2u, 5u, 64u}) {
        for (uint64_t cap : {3ull << 20, 5ull << 20, 9ull << 20, 33ull << 20}) {
          CheckLayout(cap * files + 12345, files, obj, objs);
        }
      }
    }
  }
}

TEST(PoolLayoutTest, SlotCountIsMaximalAcrossHeaderRoundingSteps) {
  // Sweep capacities around the points where the header area crosses 1 MiB steps.
  for (uint64_t cap = (1ull << 30) - (8 << 20); cap <= (1ull << 30) + (8 << 20); cap += 4096 * 37) {
    auto l = PoolLayout::Compute(cap, 1, 32768, 64);
    ASSERT_TRUE(l.ok());
    EXPECT_LE(l->file_bytes(), cap);
    EXPECT_GT(FileBytesFor(l->num_slots() + 1, 1, 32768, 64), cap) << cap;
  }
}

}  // namespace
}  // namespace tutti::pool
