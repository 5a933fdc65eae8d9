// What BlockStore refuses at start and at RegisterNamespace: sizes that cannot be mapped (named by
// the config fields that set them) and namespace layouts whose object size overflows.
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/block_store.h"
#include "daemon/store/store_test_util.h"
#include "daemon/store/index.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kFrame = 4096;
constexpr uint32_t kObjects = 8;
constexpr uint64_t kPiB = 1ull << 50;  // beyond a 47-bit user address space: never mappable

class BlockStoreStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = store::testing::FreshStateDir("start");
    auto layout = pool::PoolLayout::Compute(8ull << 20, 1, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    testing::UseTestPool(&options_, *layout, state_dir_, 16, 8);
  }
  void TearDown() override { std::filesystem::remove_all(state_dir_); }

  absl::StatusOr<std::unique_ptr<BlockStore>> Open() {
    auto disk = io::MemoryDisk::Create({options_.layout.file_bytes()});
    if (!disk.ok()) return disk.status();
    return BlockStore::Open(options_, io::MemoryBackend::CreateOn(*disk), &clock_);
  }

  std::string state_dir_;
  StoreOptions options_;
  ManualClock clock_;
};

TEST_F(BlockStoreStartTest, PoolOfMoreSlotsThanTheIndexHoldsIsRefusedNamingTheLimit) {
  // 2^32 slots of one 4 KiB object (8 KiB each with the header): only the layout is this large;
  // the refusal comes before the backend's file sizes are looked at.
  auto layout = pool::PoolLayout::Compute((Index::kMaxSlots + 4096) * 2 * kFrame, 1, kFrame, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_GT(layout->num_slots(), Index::kMaxSlots);
  options_.layout = *layout;
  auto disk = io::MemoryDisk::Create({1 << 20});
  ASSERT_TRUE(disk.ok());
  auto store = BlockStore::Open(options_, io::MemoryBackend::CreateOn(*disk), &clock_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << store.status();
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(absl::StrCat("the index holds at most ", Index::kMaxSlots)));
}

TEST_F(BlockStoreStartTest, DramTierThatCannotBeMappedNamesItsField) {
  options_.dram_bytes = kPiB;
  auto store = Open();
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted) << store.status();
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(absl::StrCat("dram.capacity_bytes = ", kPiB, ": mmap of ")));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(strerror(ENOMEM)));
}

TEST_F(BlockStoreStartTest, StagingThatCannotBeMappedNamesItsFields) {
  options_.store_staging_bytes = kPiB;
  auto store = Open();
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted) << store.status();
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(absl::StrCat("limits.store_staging_bytes = ", kPiB,
                                     ", limits.retrieve_staging_bytes = ")));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(strerror(ENOMEM)));
}

tutti::v1::Namespace Mla(uint32_t tokens, uint32_t heads, uint32_t dim, uint32_t dtype) {
  tutti::v1::Namespace ns;
  ns.set_model_id("m");
  ns.set_hash_scheme("test");
  ns.set_tp_size(1);
  auto* l = ns.mutable_layout();
  l->set_num_layers(1);
  l->set_kv_heads(heads);
  l->set_head_dim(dim);
  l->set_dtype_bytes(dtype);
  l->set_block_tokens(tokens);
  l->set_format(tutti::v1::KV_FORMAT_MLA);
  return ns;
}

TEST_F(BlockStoreStartTest, ObjectSizeThatOverflowsIsRejectedNamingTheFields) {
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->RegisterNamespace(Mla(16, 1, 128, 2)).ok());  // 4096 bytes: fits
  // 69632 x 308761441 x 858001 x 1 = 2^64 + 4096: wraps to one frame in unchecked uint64.
  auto wrapped = (*store)->RegisterNamespace(Mla(69632, 308761441, 858001, 1));
  ASSERT_FALSE(wrapped.ok()) << "accepted an object size of 2^64 + 4096 bytes";
  EXPECT_EQ(wrapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrapped.status().message()),
              HasSubstr("block_tokens x kv_heads x head_dim x dtype_bytes = 69632 x 308761441 x "
                        "858001 x 1 = more than 2^64"));
  auto large = (*store)->RegisterNamespace(Mla(65536, 65536, 1, 1));  // 2^32: no wrap, too large
  EXPECT_EQ(large.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(large.status().message()), HasSubstr("= 4294967296 bytes"));
}

}  // namespace
}  // namespace tutti::store
