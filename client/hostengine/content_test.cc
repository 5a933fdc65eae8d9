#include "client/hostengine/content.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::hostengine {
namespace {

TEST(KeyChainTest, DeterministicAndPrefixStable) {
  const auto a = MakeKeyChain(7, 100);
  const auto b = MakeKeyChain(7, 40);
  ASSERT_EQ(a.size(), 100u);
  ASSERT_EQ(b.size(), 40u);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
}

TEST(KeyChainTest, DistinctKeysAndSeeds) {
  const auto a = MakeKeyChain(1, 1000);
  const auto b = MakeKeyChain(2, 1000);
  std::set<std::string> seen;
  for (const Key& k : a) seen.insert(std::string(k.view()));
  for (const Key& k : b) seen.insert(std::string(k.view()));
  EXPECT_EQ(seen.size(), 2000u);
}

TEST(ContentTest, FillThenVerify) {
  const Key key = MakeKeyChain(3, 1)[0];
  for (size_t len : {0, 1, 7, 8, 9, 4096, 32768 + 5}) {
    std::vector<uint8_t> buf(len);
    FillObject(key, 2, 1, absl::MakeSpan(buf));
    EXPECT_EQ(CountObjectMismatches(key, 2, 1, buf), 0u) << len;
  }
}

TEST(ContentTest, EveryChangedByteCounts) {
  const Key key = MakeKeyChain(3, 1)[0];
  std::vector<uint8_t> buf(4099);
  FillObject(key, 0, 0, absl::MakeSpan(buf));
  buf[0] ^= 1;
  buf[9] ^= 0x80;
  buf[10] ^= 0x01;
  buf[4098] ^= 0xff;  // in the tail
  EXPECT_EQ(CountObjectMismatches(key, 0, 0, buf), 4u);
}

TEST(ContentTest, DependsOnKeyLayerAndPart) {
  const auto keys = MakeKeyChain(3, 2);
  std::vector<uint8_t> buf(4096);
  FillObject(keys[0], 1, 0, absl::MakeSpan(buf));
  EXPECT_GT(CountObjectMismatches(keys[1], 1, 0, buf), 4000u);
  EXPECT_GT(CountObjectMismatches(keys[0], 2, 0, buf), 4000u);
  EXPECT_GT(CountObjectMismatches(keys[0], 1, 1, buf), 4000u);
  std::vector<uint8_t> zeros(4096);
  EXPECT_GT(CountObjectMismatches(keys[0], 1, 0, zeros), 4000u);
}

}  // namespace
}  // namespace tutti::hostengine
