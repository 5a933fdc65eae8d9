#include "daemon/server/request_checks.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server {
namespace {

using ::testing::HasSubstr;

std::string KeyBytes(char c) { return std::string(16, c); }

void ExpectInvalid(const absl::Status& s, const std::string& part) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(part));
}

google::protobuf::RepeatedPtrField<tutti::v1::BlockPair> Pairs(
    std::vector<std::pair<std::string, uint32_t>> v) {
  google::protobuf::RepeatedPtrField<tutti::v1::BlockPair> out;
  for (auto& [k, b] : v) {
    auto* p = out.Add();
    p->set_key(k);
    p->set_engine_block(b);
  }
  return out;
}

TEST(ParseKeysTest, AcceptsDistinctSixteenByteKeysInOrder) {
  google::protobuf::RepeatedPtrField<std::string> keys;
  *keys.Add() = KeyBytes('a');
  *keys.Add() = KeyBytes('b');
  auto parsed = ParseKeys(keys, 2);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[1].view(), KeyBytes('b'));
  EXPECT_TRUE(ParseKeys({}, 2).ok());
}

TEST(ParseLookupKeysTest, PackedKeysParseAsTheSameChain) {
  tutti::v1::LookupRequest req;
  for (char c : std::string("abc")) req.mutable_packed_keys()->append(std::string(16, c));
  auto parsed = ParseLookupKeys(req, 8);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 3u);
  EXPECT_EQ((*parsed)[2].view(), std::string(16, 'c'));
  tutti::v1::LookupRequest plain;
  for (char c : std::string("abc")) plain.add_keys(std::string(16, c));
  auto same = ParseLookupKeys(plain, 8);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(*same == *parsed);
}

TEST(ParseLookupKeysTest, RejectsBothFormsRaggedDuplicateAndTooMany) {
  tutti::v1::LookupRequest both;
  both.add_keys(std::string(16, 'a'));
  both.set_packed_keys(std::string(16, 'b'));
  ExpectInvalid(ParseLookupKeys(both, 8).status(), "give keys or packed_keys, not both");
  tutti::v1::LookupRequest ragged;
  ragged.set_packed_keys(std::string(33, 'a'));
  ExpectInvalid(ParseLookupKeys(ragged, 8).status(), "packed_keys: 33 bytes; must be a multiple");
  tutti::v1::LookupRequest dup;
  dup.set_packed_keys(std::string(16, 'a') + std::string(16, 'b') + std::string(16, 'a'));
  ExpectInvalid(ParseLookupKeys(dup, 8).status(), "packed_keys[2]: duplicate of packed_keys[0]");
  ExpectInvalid(ParseLookupKeys(dup, 2).status(), "max_blocks_per_call");
}

TEST(ParseKeysTest, RejectsShortLongDuplicateAndTooMany) {
  google::protobuf::RepeatedPtrField<std::string> keys;
  *keys.Add() = KeyBytes('a');
  *keys.Add() = std::string(15, 'x');
  ExpectInvalid(ParseKeys(keys, 8).status(), "keys[1]: a key must be exactly 16 bytes, got 15");
  keys[1] = std::string(17, 'x');
  ExpectInvalid(ParseKeys(keys, 8).status(), "got 17");
  keys[1] = KeyBytes('a');
  ExpectInvalid(ParseKeys(keys, 8).status(), "keys[1]: duplicate of keys[0]");
  keys[1] = KeyBytes('b');
  ExpectInvalid(ParseKeys(keys, 1).status(), "max_blocks_per_call");
}

TEST(ParseBlocksTest, SplitsPairs) {
  auto batch = ParseBlocks(Pairs({{KeyBytes('a'), 3}, {KeyBytes('b'), 0}}), 4, 8);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->engine_blocks, (std::vector<uint32_t>{3, 0}));
  EXPECT_EQ(batch->keys[0].view(), KeyBytes('a'));
}

TEST(ParseBlocksTest, RejectsEveryBadPair) {
  ExpectInvalid(ParseBlocks(Pairs({}), 4, 8).status(), "at least one");
  ExpectInvalid(ParseBlocks(Pairs({{KeyBytes('a'), 4}}), 4, 8).status(),
                "blocks[0].engine_block = 4");
  ExpectInvalid(ParseBlocks(Pairs({{"short", 0}}), 4, 8).status(), "blocks[0]: a key");
  ExpectInvalid(ParseBlocks(Pairs({{KeyBytes('a'), 0}, {KeyBytes('a'), 1}}), 4, 8).status(),
                "blocks[1].key: duplicate of blocks[0]");
  ExpectInvalid(ParseBlocks(Pairs({{KeyBytes('a'), 2}, {KeyBytes('b'), 2}}), 4, 8).status(),
                "blocks[1].engine_block = 2: duplicate of blocks[0]");
  ExpectInvalid(ParseBlocks(Pairs({{KeyBytes('a'), 0}, {KeyBytes('b'), 1}}), 4, 1).status(),
                "at most 1");
}

TEST(ParseLayerRangeTest, ZeroEndMeansAllLayers) {
  auto r = ParseLayerRange(0, 0, 32);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->begin, 0u);
  EXPECT_EQ(r->end, 32u);
  r = ParseLayerRange(5, 6, 32);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->end, 6u);
  ExpectInvalid(ParseLayerRange(4, 4, 32).status(), "layer range [4, 4)");
  ExpectInvalid(ParseLayerRange(0, 33, 32).status(), "<= 32");
  ExpectInvalid(ParseLayerRange(32, 0, 32).status(), "layer range");
}

TEST(RequestChecksTest, LeaseIdsOfARetrieve) {
  tutti::v1::RetrieveRequest req;
  req.set_lease_id(5);
  EXPECT_THAT(*ParseLeaseIds(req), ::testing::ElementsAre(5u));
  req.add_lease_ids(7);
  req.add_lease_ids(9);
  EXPECT_THAT(*ParseLeaseIds(req), ::testing::ElementsAre(5u, 7u, 9u));
  req.set_lease_id(0);  // allowed once lease_ids names some
  EXPECT_THAT(*ParseLeaseIds(req), ::testing::ElementsAre(7u, 9u));
  req.add_lease_ids(7);
  ExpectInvalid(ParseLeaseIds(req).status(), "lease_ids[2]: lease 7 is named twice (also in lease_ids[0])");
  req.clear_lease_ids();
  req.set_lease_id(7);
  req.add_lease_ids(7);
  ExpectInvalid(ParseLeaseIds(req).status(), "(also in lease_id)");
  req.clear_lease_ids();
  for (int i = 0; i < kMaxLeasesPerRetrieve; ++i) req.add_lease_ids(100 + i);
  EXPECT_EQ(ParseLeaseIds(req)->size(), kMaxLeasesPerRetrieve + 1u);
  req.add_lease_ids(99);
  ExpectInvalid(ParseLeaseIds(req).status(), "lease_ids: 1025 in one call, at most 1024");
}

}  // namespace
}  // namespace tutti::server
