#include "daemon/server/key_table.h"

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::server {
namespace {

Key RandomKey(std::mt19937_64& rng) {
  Key k;
  const uint64_t lo = rng(), hi = rng();
  std::memcpy(k.bytes.data(), &lo, 8);
  std::memcpy(k.bytes.data() + 8, &hi, 8);
  return k;
}

Key KeyOf(uint64_t lo, uint64_t hi) {
  Key k;
  std::memcpy(k.bytes.data(), &lo, 8);
  std::memcpy(k.bytes.data() + 8, &hi, 8);
  return k;
}

std::vector<Key> RandomChain(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Key> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(RandomKey(rng));
  return keys;
}

// The first duplicate by brute force: the reference.
std::optional<Duplicate> Slow(const std::vector<Key>& keys) {
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (keys[i] == keys[j]) return Duplicate{i, j};
    }
  }
  return std::nullopt;
}

TEST(KeyTableTest, DistinctChainsHaveNoDuplicate) {
  for (size_t n : {0, 1, 2, 7, 8, 9, 2047, 2048, 2049, 20000}) {
    EXPECT_FALSE(FindDuplicate(RandomChain(n, n)).has_value()) << n;
  }
}

TEST(KeyTableTest, FindsTheFirstRepetitionAndWhatItRepeats) {
  std::vector<Key> keys = RandomChain(2048, 1);
  keys[1500] = keys[3];
  keys[1700] = keys[10];
  std::optional<Duplicate> d = FindDuplicate(keys);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->index, 1500u);
  EXPECT_EQ(d->first, 3u);
  keys = RandomChain(2, 2);
  keys[1] = keys[0];
  d = FindDuplicate(keys);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->index, 1u);
  EXPECT_EQ(d->first, 0u);
}

TEST(KeyTableTest, AgreesWithBruteForceOnSmallAlphabets) {
  // Keys drawn from a few values (many repeats), and keys that differ in one 64-bit half only
  // or in one byte: the word compare must see every byte.
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = rng() % 60;
    const int alphabet = 1 + static_cast<int>(rng() % 80);
    std::vector<Key> keys;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t v = rng() % alphabet;
      switch (trial % 3) {
        case 0: keys.push_back(KeyOf(v, 0)); break;
        case 1: keys.push_back(KeyOf(0, v)); break;
        default: {
          Key k;  // all zero but byte v % 16, set to v / 16 + 1
          k.bytes[v % 16] = static_cast<uint8_t>(v / 16 + 1);
          keys.push_back(k);
        }
      }
    }
    std::optional<Duplicate> want = Slow(keys), got = FindDuplicate(keys);
    ASSERT_EQ(got.has_value(), want.has_value()) << trial;
    if (want) {
      EXPECT_EQ(got->index, want->index) << trial;
      EXPECT_EQ(got->first, want->first) << trial;
    }
  }
}

TEST(KeyTableTest, InsertAndFind) {
  std::vector<Key> keys = RandomChain(1000, 4);
  keys.push_back(keys[17]);  // index 1000 repeats 17
  KeyTable table(keys, keys.size());
  EXPECT_EQ(table.slots(), 2048u);  // a power of two, at least twice the capacity
  for (size_t i = 0; i < 1000; ++i) EXPECT_EQ(table.Insert(i), i);
  EXPECT_EQ(table.Insert(1000), 17u);
  EXPECT_EQ(table.size(), 1000u);
  for (size_t i = 0; i < 1000; ++i) EXPECT_EQ(table.Find(keys[i]), i);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(table.Find(RandomKey(rng)).has_value());
  // 2048 keys: 4096 slots of 4 bytes, 16 KiB.
  EXPECT_EQ(KeyTable(keys, 2048).slots() * sizeof(uint32_t), 16384u);
}

TEST(KeyTableTest, KeysEqualInWordsAreEqual) {
  Key a = KeyOf(1, 2), b = KeyOf(1, 2), c = KeyOf(1, 3), d = KeyOf(2, 2);
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == c);
  EXPECT_FALSE(a == d);
  EXPECT_TRUE(a != c);
}

}  // namespace
}  // namespace tutti::server
