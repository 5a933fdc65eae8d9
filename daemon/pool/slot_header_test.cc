#include "daemon/pool/slot_header.h"

#include <cstring>
#include <vector>

#include "daemon/pool/layout.h"
#include "gtest/gtest.h"

namespace tutti::pool {
namespace {

Key MakeKey(uint8_t seed) {
  Key k;
  for (size_t i = 0; i < Key::kSize; ++i) k.bytes[i] = static_cast<uint8_t>(seed + i * 7);
  return k;
}

SlotHeader Sample(size_t objects) {
  SlotHeader h;
  h.ns = 0x1122334455667788ull;
  h.key = MakeKey(3);
  h.epoch = 42;
  h.object_len = 32768;
  for (size_t i = 0; i < objects; ++i) h.checksums.push_back(0xABCDEF00ull + i);
  return h;
}

TEST(SlotHeaderTest, RoundTrips) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{64}, size_t{kMaxObjectsPerSlot}}) {
    std::vector<uint8_t> page(kSlotHeaderBytes, 0xCC);
    const SlotHeader h = Sample(n);
    ASSERT_TRUE(EncodeSlotHeader(h, absl::MakeSpan(page)).ok());
    auto d = DecodeSlotHeader(page);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->ns, h.ns);
    EXPECT_EQ(d->key, h.key);
    EXPECT_EQ(d->epoch, h.epoch);
    EXPECT_EQ(d->object_len, h.object_len);
    EXPECT_EQ(d->checksums, h.checksums);
  }
}

TEST(SlotHeaderTest, FixedFieldsAreLittleEndianAtDocumentedOffsets) {
  std::vector<uint8_t> page(kSlotHeaderBytes);
  ASSERT_TRUE(EncodeSlotHeader(Sample(2), absl::MakeSpan(page)).ok());
  EXPECT_EQ(std::memcmp(page.data(), "TSLH", 4), 0);
  EXPECT_EQ(page[4], 1);      // version
  EXPECT_EQ(page[6], 2);      // object count
  EXPECT_EQ(page[9], 0x80);   // object_len 0x8000
  EXPECT_EQ(page[16], 0x88);  // ns, low byte first
  EXPECT_EQ(page[24], MakeKey(3).bytes[0]);
  EXPECT_EQ(page[40], 42);    // epoch
  EXPECT_EQ(page[64], 0x00);  // first object checksum 0xABCDEF00
  EXPECT_EQ(page[65], 0xEF);
  for (size_t i = 80; i < kSlotHeaderBytes; ++i) ASSERT_EQ(page[i], 0) << i;
}

TEST(SlotHeaderTest, NeverWrittenPageIsDataLoss) {
  std::vector<uint8_t> page(kSlotHeaderBytes, 0);
  EXPECT_EQ(DecodeSlotHeader(page).status().code(), absl::StatusCode::kDataLoss);
}

TEST(SlotHeaderTest, AnyFlippedByteIsDataLoss) {
  std::vector<uint8_t> page(kSlotHeaderBytes);
  ASSERT_TRUE(EncodeSlotHeader(Sample(64), absl::MakeSpan(page)).ok());
  for (size_t i = 0; i < kSlotHeaderBytes; ++i) {
    page[i] ^= 0x01;
    ASSERT_EQ(DecodeSlotHeader(page).status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
    page[i] ^= 0x01;
  }
  EXPECT_TRUE(DecodeSlotHeader(page).ok());
}

TEST(SlotHeaderTest, BadArguments) {
  std::vector<uint8_t> page(kSlotHeaderBytes);
  EXPECT_EQ(EncodeSlotHeader(Sample(kMaxObjectsPerSlot + 1), absl::MakeSpan(page)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> small(512);
  EXPECT_EQ(EncodeSlotHeader(Sample(1), absl::MakeSpan(small)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeSlotHeader(small).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ObjectChecksumTest, SeededByIdentity) {
  std::vector<uint8_t> data(32768);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 31);
  const Key k = MakeKey(1);
  const uint64_t base = ObjectChecksum(7, k, 100, 3, data.data(), data.size());
  EXPECT_EQ(base, ObjectChecksum(7, k, 100, 3, data.data(), data.size()));
  EXPECT_NE(base, ObjectChecksum(8, k, 100, 3, data.data(), data.size()));
  EXPECT_NE(base, ObjectChecksum(7, MakeKey(2), 100, 3, data.data(), data.size()));
  EXPECT_NE(base, ObjectChecksum(7, k, 101, 3, data.data(), data.size()));
  EXPECT_NE(base, ObjectChecksum(7, k, 100, 4, data.data(), data.size()));
  EXPECT_NE(base, ObjectChecksum(7, k, 100, 3, data.data(), data.size() - 4096));
  data[12345] ^= 1;
  EXPECT_NE(base, ObjectChecksum(7, k, 100, 3, data.data(), data.size()));
}

TEST(ObjectChecksumTest, ValueIsStableAcrossBuilds) {
  // On-disk format: changing this value makes every stored block a miss. See FORMAT.md.
  std::vector<uint8_t> data(4096, 0x5A);
  EXPECT_EQ(ObjectChecksum(1, MakeKey(0), 2, 3, data.data(), data.size()), 0xa935de689364c61bull)
      << std::hex << ObjectChecksum(1, MakeKey(0), 2, 3, data.data(), data.size());
}

}  // namespace
}  // namespace tutti::pool
