// Recovery on its own (recovery.h): a state directory written through the journal, replayed into
// an index, without a BlockStore around it.
#include "daemon/store/recovery.h"

#include <vector>

#include "daemon/io/memory_backend.h"
#include "daemon/store/store_test_util.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

using testing::FreshStateDir;
using testing::TestKey;
using testing::TestNamespace;

constexpr uint32_t kFrame = 4096;
constexpr NamespaceId kNs = 7;

PutRecord Put(uint32_t key, uint64_t slot, uint64_t epoch, uint64_t last_use = 0) {
  return PutRecord{kNs, TestKey(key), slot, epoch, kFrame, {key, key + 1}, last_use};
}

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto layout = pool::PoolLayout::Compute(16ull << 20, 1, kFrame, 2, 1);
    ASSERT_TRUE(layout.ok()) << layout.status();
    ASSERT_GE(layout->num_slots(), 8u);
    options_.layout = *layout;
    options_.state_dir = FreshStateDir("recovery");
    auto backend = io::MemoryBackend::Create({layout->file_bytes()});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(backend).value();
  }

  StoreOptions options_;
  std::unique_ptr<io::MemoryBackend> backend_;
};

TEST_F(RecoveryTest, ReplaysACheckpointAndTheJournalAfterItIntoTheIndex) {
  {
    RecoveryReport report;
    auto journal = Journal::Open(options_.state_dir, RecoveryVisitor{}, &report);
    ASSERT_TRUE(journal.ok()) << journal.status();
    const NamespaceRecord ns{kNs, TestNamespace(1).SerializeAsString(), "", 0, true};
    // A checkpoint in slot order, its last uses in another: slot 1 oldest, then 2, then 0.
    ASSERT_TRUE((*journal)
                    ->Checkpoint([&](Journal::Emitter& out) {
                      out.Emit(ns);
                      out.Emit(Put(10, 0, 1, 30));
                      out.Emit(Put(11, 1, 2, 10));
                      out.Emit(Put(12, 2, 3, 20));
                    })
                    .ok());
    (*journal)->Append(Put(13, 3, 4));                         // newer than the checkpoint's
    (*journal)->Append(DeleteRecord{kNs, TestKey(12), 2, 3});  // slot 2 freed
    (*journal)->Append(Put(14, options_.layout.num_slots(), 9));  // another geometry's slot
    ASSERT_TRUE((*journal)->Sync().ok());
  }
  Index index(options_.layout.num_slots(), options_.layout.max_objects());
  absl::StatusOr<RecoveredState> state = RecoverStore(options_, backend_.get(), &index);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_NE(state->journal, nullptr);
  EXPECT_EQ(state->namespaces.size(), 1u);
  EXPECT_EQ(state->namespaces.at(kNs).id, kNs);
  EXPECT_EQ(state->registered_order.at(kNs), 0u);
  EXPECT_EQ(state->next_order, 1u);
  EXPECT_EQ(state->next_epoch, 10u) << "past the skipped put's epoch too";
  EXPECT_EQ(state->blocks_lost, 1u) << "the put of another geometry";
  EXPECT_EQ(state->unindexed_slot_headers, 0u) << "not probed: the journal held blocks";

  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.free_slots(), options_.layout.num_slots() - 3);
  ASSERT_NE(index.Find(kNs, TestKey(13)), nullptr);
  EXPECT_EQ(index.Find(kNs, TestKey(13))->slot, 3u);
  EXPECT_EQ(index.Find(kNs, TestKey(12)), nullptr);
  EXPECT_EQ(index.AtSlot(2), nullptr);
  const Entry* e = index.Find(kNs, TestKey(11));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(std::vector<uint64_t>(index.Checksums(*e).begin(), index.Checksums(*e).end()),
            (std::vector<uint64_t>{11, 12}));
  // Evicted in last-use order: the checkpoint's by their last uses, the journal's put last.
  std::vector<uint64_t> victims;
  while (Entry* v = index.Victim()) {
    victims.push_back(v->slot);
    index.Remove(v);
  }
  EXPECT_EQ(victims, (std::vector<uint64_t>{1, 0, 3}));
}

TEST_F(RecoveryTest, AnEmptyStateDirectoryGivesAnEmptyIndexAndProbesThePool) {
  Index index(options_.layout.num_slots(), options_.layout.max_objects());
  absl::StatusOr<RecoveredState> state = RecoverStore(options_, backend_.get(), &index);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.free_slots(), options_.layout.num_slots());
  EXPECT_TRUE(state->namespaces.empty());
  EXPECT_EQ(state->next_epoch, 1u);
  EXPECT_EQ(state->blocks_lost, 0u);
  EXPECT_EQ(state->unindexed_slot_headers, 0u) << "a fresh pool's headers do not decode";
}

}  // namespace
}  // namespace tutti::store
