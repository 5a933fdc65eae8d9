// Shared by the block store's tests: a fresh state directory, a test pool's options and its
// in-memory disk, a small test namespace and distinct keys. Test-only.
#ifndef TUTTI_DAEMON_STORE_STORE_TEST_UTIL_H_
#define TUTTI_DAEMON_STORE_STORE_TEST_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/types.h"
#include "daemon/io/memory_backend.h"
#include "daemon/pool/layout.h"
#include "daemon/store/block_store.h"
#include "gtest/gtest.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::store::testing {

// An empty directory for the running test's state: TempDir()/<tag>_<pid>_<test name>, removed
// first if a previous run left it.
inline std::string FreshStateDir(std::string_view tag) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/", std::string(tag), "_", getpid(), "_",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Sets `options` to a test store on `layout`'s pool with its state in `state_dir`:
// `staging_blocks` slots' worth of store staging and as much retrieve staging, write batches of
// `batch_blocks` blocks. Other fields are left as they are.
inline void UseTestPool(StoreOptions* options, const pool::PoolLayout& layout,
                        const std::string& state_dir, uint32_t staging_blocks = 64,
                        uint32_t batch_blocks = 8) {
  options->layout = layout;
  options->state_dir = state_dir;
  const uint64_t slot = uint64_t{layout.max_objects()} * layout.object_bytes();
  options->store_staging_bytes = staging_blocks * slot;
  options->retrieve_staging_bytes = staging_blocks * slot;
  options->write_batch_blocks = batch_blocks;
}

// A fresh in-memory disk with one file for each of `layout`'s (null, with a test failure, if it
// cannot be made).
inline std::shared_ptr<io::MemoryDisk> TestDisk(const pool::PoolLayout& layout) {
  auto disk =
      io::MemoryDisk::Create(std::vector<uint64_t>(layout.num_files(), layout.file_bytes()));
  EXPECT_TRUE(disk.ok()) << disk.status();
  return disk.ok() ? *disk : nullptr;
}

// SEPARATE K and V, 16 tokens x `kv_heads` x 64 dims x 2 bytes (2 KiB per head) per object.
inline tutti::v1::Namespace TestNamespace(uint32_t layers, uint32_t kv_heads = 1,
                                          const std::string& model = "m") {
  tutti::v1::Namespace ns;
  ns.set_model_id(model);
  ns.set_hash_scheme("test");
  ns.set_tp_size(1);
  auto* l = ns.mutable_layout();
  l->set_num_layers(layers);
  l->set_kv_heads(kv_heads);
  l->set_head_dim(64);
  l->set_dtype_bytes(2);
  l->set_block_tokens(16);
  l->set_format(tutti::v1::KV_FORMAT_SEPARATE);
  return ns;
}

// Key i: distinct for every i, all 16 bytes used.
inline Key TestKey(uint32_t i) {
  Key k;
  for (int b = 0; b < 16; ++b) k.bytes[b] = static_cast<uint8_t>((i * 131 + b * 7) ^ (i >> 8));
  return k;
}

// Keys first .. first + n - 1.
inline std::vector<Key> TestKeys(uint32_t first, uint32_t n) {
  std::vector<Key> keys;
  for (uint32_t i = first; i < first + n; ++i) keys.push_back(TestKey(i));
  return keys;
}

}  // namespace tutti::store::testing

#endif  // TUTTI_DAEMON_STORE_STORE_TEST_UTIL_H_
