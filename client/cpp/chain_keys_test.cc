// SHA-256 against FIPS 180-4 vectors, and ChainKeys against keys computed independently with
// Python's hashlib (the Python package's tutti.chain_keys must give the same bytes).
#include <cstring>
#include <numeric>
#include <string>

#include "client/cpp/sha256.h"
#include "gtest/gtest.h"
#include "tutti/client.h"

namespace tutti::client {
namespace {

std::string Hex(const uint8_t* p, size_t n) {
  BlockKey k{};
  std::string out;
  for (size_t i = 0; i < n; i += 16) {
    std::memcpy(k.data(), p + i, 16);
    out += KeyHex(k);
  }
  return out;
}

std::string Sha(const std::string& s) {
  Sha256 sha;
  sha.Update(s.data(), s.size());
  const Sha256::Digest d = sha.Finish();
  return Hex(d.data(), d.size());
}

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha(std::string(1000, 'a')),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(Sha256Test, PiecewiseUpdateEqualsOneUpdate) {
  const std::string s(300, 'x');
  Sha256 sha;
  for (size_t i = 0; i < s.size(); i += 7)
    sha.Update(s.data() + i, std::min<size_t>(7, s.size() - i));
  const Sha256::Digest d = sha.Finish();
  EXPECT_EQ(Hex(d.data(), d.size()), Sha(s));
}

TEST(ChainKeysTest, MatchesPythonHashlib) {
  std::vector<int32_t> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 0);
  const std::vector<BlockKey> keys = ChainKeys(tokens.data(), tokens.size(), 16);
  ASSERT_EQ(keys.size(), 2u);  // 8 tokens of a partial block get no key
  EXPECT_EQ(KeyHex(keys[0]), "955cfe76acfc9fd031300d3413d1c1ec");
  EXPECT_EQ(KeyHex(keys[1]), "0480330e1c71b2c2d1f428549c284cc3");

  BlockKey parent;
  for (int i = 0; i < 16; ++i) parent[i] = static_cast<uint8_t>(i);
  const std::vector<int32_t> sevens(16, 7);
  const auto salted = ChainKeys(sevens.data(), sevens.size(), 16, parent);
  ASSERT_EQ(salted.size(), 1u);
  EXPECT_EQ(KeyHex(salted[0]), "2192d613a4f6fde3c575a5d8f4efeea7");
}

TEST(ChainKeysTest, APrefixHasThePrefixKeysAndADifferentTokenChangesEveryLaterKey) {
  std::vector<int32_t> tokens(64);
  std::iota(tokens.begin(), tokens.end(), 100);
  const auto all = ChainKeys(tokens.data(), 64, 16);
  const auto prefix = ChainKeys(tokens.data(), 40, 16);
  ASSERT_EQ(all.size(), 4u);
  ASSERT_EQ(prefix.size(), 2u);
  EXPECT_EQ(prefix[0], all[0]);
  EXPECT_EQ(prefix[1], all[1]);
  tokens[20] = 9;  // block 1
  const auto changed = ChainKeys(tokens.data(), 64, 16);
  EXPECT_EQ(changed[0], all[0]);
  for (int b = 1; b < 4; ++b) EXPECT_NE(changed[b], all[b]) << b;
}

TEST(ChainKeysTest, ZeroBlockTokensGivesNoKeys) {
  const int32_t t[4] = {1, 2, 3, 4};
  EXPECT_TRUE(ChainKeys(t, 4, 0).empty());
}

TEST(StatusTest, ToStringAndResult) {
  EXPECT_EQ(Status().ToString(), "OK");
  EXPECT_EQ(Status(StatusCode::kUnavailable, "gone").ToString(), "UNAVAILABLE: gone");
  Result<int> r(Status(StatusCode::kNotFound, "x"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  Result<int> v(5);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 5);
  Result<int> bad{Status()};  // an OK status is not a value
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace tutti::client
