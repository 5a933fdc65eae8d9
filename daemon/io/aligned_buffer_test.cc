#include "daemon/io/aligned_buffer.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace tutti::io {
namespace {

TEST(AlignedBufferTest, AlignedZeroedAndRounded) {
  AlignedBuffer b(10000);
  EXPECT_EQ(b.size(), 12288u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kAlignment, 0u);
  for (uint64_t i = 0; i < b.size(); ++i) ASSERT_EQ(b.data()[i], 0) << i;
  EXPECT_EQ(b.span().size(), b.size());
}

TEST(AlignedBufferTest, HugePagesAreHugePageAligned) {
  AlignedBuffer b(3 << 20, HugePages::kPrefer);
  EXPECT_EQ(b.size(), 4u << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % AlignedBuffer::kHugePage, 0u);
  EXPECT_EQ(b.data()[b.size() - 1], 0);
}

TEST(AlignedBufferTest, EmptyAndMoved) {
  AlignedBuffer empty;
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.data(), nullptr);
  AlignedBuffer a(4096);
  uint8_t* p = a.data();
  AlignedBuffer b = std::move(a);
  EXPECT_EQ(b.data(), p);
}

}  // namespace
}  // namespace tutti::io
