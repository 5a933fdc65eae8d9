// The store's durability claims: one store per state directory, no durability
// acknowledged once the journal is gone, failed reads that leave the index,
// checkpoint failures that neither multiply journal files nor retry every batch,
// and a journal that registrations and evictions share without waiting for a
// batch's pool syncs.
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/holding_backend.h"
#include "daemon/store/block_store.h"
#include "daemon/store/store_test_util.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kLayers = 4;
constexpr uint32_t kObjects = 2 * kLayers;
constexpr uint32_t kObjectLen = 2048;
constexpr uint32_t kFrame = 4096;
constexpr absl::Duration kPatience = absl::Seconds(10);  // only bounds a hang: never waited out

tutti::v1::Namespace TestNamespace(const std::string& model = "m") {
  return testing::TestNamespace(kLayers, 1, model);
}

Key K(uint32_t i) { return testing::TestKey(i); }

uint8_t ContentByte(const Key& key, uint32_t object, uint32_t offset, uint8_t version) {
  return static_cast<uint8_t>(key.bytes[offset % 16] * 31 + object * 17 + offset / 16 + version);
}

using testing::HoldingBackend;

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/durability_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    state_dir_ = root_ + "/state";
    fs::create_directories(state_dir_);
    auto layout = pool::PoolLayout::Compute(capacity_, 2, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    testing::UseTestPool(&options_, *layout, state_dir_);
    disk_ = NewDisk();
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(root_);
  }

  std::shared_ptr<io::MemoryDisk> NewDisk() { return testing::TestDisk(options_.layout); }

  absl::StatusOr<std::unique_ptr<BlockStore>> OpenOn(std::unique_ptr<io::IoBackend> backend) {
    return BlockStore::Open(options_, std::move(backend), &clock_);
  }

  // (Re)opens store_ on disk_ (or on `backend`) and registers the namespace.
  void Open(std::unique_ptr<io::IoBackend> backend = nullptr) {
    store_.reset();
    if (backend == nullptr) backend = io::MemoryBackend::CreateOn(disk_);
    auto store = OpenOn(std::move(backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    auto ns = store_->RegisterNamespace(TestNamespace());
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
  }

  std::vector<CaptureOutcome> Store(absl::Span<const Key> keys, bool wait = true,
                                    uint8_t version = 0) {
    std::vector<Key> copy(keys.begin(), keys.end());
    auto gather = [copy, version](absl::Span<const engine::CopyOp> ops) {
      for (const engine::CopyOp& op : ops) {
        for (uint32_t i = 0; i < kObjectLen; ++i) {
          op.staging[i] = ContentByte(copy[op.block], op.object, i, version);
        }
      }
      return absl::OkStatus();
    };
    auto out = store_->Capture(ns_, keys, 0, kLayers, gather, wait);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<CaptureOutcome>();
  }

  // Reads every layer of pinned `keys`, checking the bytes of those served;
  // returns the failed items.
  std::vector<uint32_t> Read(absl::Span<const Key> keys, uint8_t version = 0) {
    std::vector<uint32_t> failed;
    absl::Status s = store_->Read(ns_, keys, 0, kLayers, [&](const datapath::LayerObjects& got) {
      const absl::Span<const engine::CopyOp> ops = got.copies;
      const absl::Span<const uint32_t> bad = got.failed_items;
      failed.insert(failed.end(), bad.begin(), bad.end());
      for (const engine::CopyOp& op : ops) {
        for (uint32_t i = 0; i < kObjectLen; ++i) {
          if (op.staging[i] != ContentByte(keys[op.block], op.object, i, version)) {
            return absl::InternalError(absl::StrCat("item ", op.block, " byte ", i));
          }
        }
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
    return failed;
  }

  std::vector<Key> Keys(uint32_t first, uint32_t n) {
    std::vector<Key> keys;
    for (uint32_t i = first; i < first + n; ++i) keys.push_back(K(i));
    return keys;
  }

  int JournalFiles() {
    int n = 0;
    for (const auto& e : fs::directory_iterator(state_dir_)) {
      n += e.path().filename().string().rfind("journal.", 0) == 0;
    }
    return n;
  }

  uint64_t capacity_ = 8ull << 20;
  std::string root_, state_dir_;
  StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceId ns_ = 0;
};

TEST_F(DurabilityTest, ASecondStoreOnTheSameStateDirectoryIsRefusedAndTheFirstKeepsWorking) {
  Open();
  auto second = OpenOn(io::MemoryBackend::CreateOn(NewDisk()));
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find(state_dir_), std::string::npos) << second.status();
  EXPECT_NE(second.status().message().find(absl::StrCat("pid ", getpid())), std::string::npos)
      << second.status();
  auto keys = Keys(0, 4);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 4u);
  EXPECT_TRUE(Read(keys).empty());
  store_->Unpin(ns_, keys);
  Open();  // the lock goes with the store: the next one opens and recovers everything
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 4u);
  EXPECT_TRUE(Read(keys).empty());
}

TEST_F(DurabilityTest, RemovedStateDirectoryStopsDurableAcknowledgementsAndIsReportedAtStart) {
  Open();
  EXPECT_EQ(store_->Stats().unindexed_slot_headers, 0u) << "a fresh pool";
  auto before = Keys(0, 4);
  for (CaptureOutcome o : Store(before)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  EXPECT_FALSE(store_->Stats().durability_lost);
  fs::remove_all(state_dir_);
  auto after = Keys(100, 4);
  for (CaptureOutcome o : Store(after)) EXPECT_EQ(o, CaptureOutcome::kFailed);
  EXPECT_EQ(store_->LookupAndPin(ns_, absl::MakeSpan(after).subspan(0, 1)), 0u)
      << "a block that is not durable is not visible";
  for (CaptureOutcome o : Store(Keys(200, 2))) EXPECT_EQ(o, CaptureOutcome::kFailed);
  StoreStats st = store_->Stats();
  EXPECT_TRUE(st.durability_lost);
  EXPECT_NE(st.durability_error.find(state_dir_), std::string::npos) << st.durability_error;
  EXPECT_EQ(st.store_failed, 6u);
  // A restart over a fresh state directory and the same pool says the pool is used.
  store_.reset();
  fs::create_directories(state_dir_);
  Open();
  EXPECT_EQ(store_->LookupAndPin(ns_, before), 0u);
  st = store_->Stats();
  EXPECT_EQ(st.unindexed_slot_headers, before.size() + after.size())
      << "the batch that found the journal gone had written its blocks";
  EXPECT_FALSE(st.durability_lost);
}

// A block's write epoch is given when its capture starts (it seeds the checksums that GPU mode
// computes as it gathers), so a block started first and completed last is written after blocks
// with later epochs. Recovery compares epochs only for equality: all are served, across a
// restart, and blocks stored after it too.
TEST_F(DurabilityTest, ABlockWrittenAfterOneWithALaterEpochIsServedAcrossARestart) {
  Open();
  const std::vector<Key> first = Keys(0, 1), later = Keys(1, 2);
  auto gather = [](absl::Span<const Key> keys) {
    std::vector<Key> copy(keys.begin(), keys.end());
    return [copy](absl::Span<const engine::CopyOp> ops) {
      for (const engine::CopyOp& op : ops) {
        for (uint32_t i = 0; i < kObjectLen; ++i) {
          op.staging[i] = ContentByte(copy[op.block], op.object, i, 0);
        }
      }
      return absl::OkStatus();
    };
  };
  auto half = store_->Capture(ns_, first, 0, kLayers / 2, gather(first), false);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ((*half)[0], CaptureOutcome::kCaptured);
  for (CaptureOutcome o : Store(later)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  auto rest = store_->Capture(ns_, first, kLayers / 2, kLayers, gather(first), true);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ((*rest)[0], CaptureOutcome::kDurable);
  std::vector<Key> all = first;
  all.insert(all.end(), later.begin(), later.end());
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(store_->LookupAndPin(ns_, all), all.size()) << "round " << round;
    EXPECT_TRUE(Read(all).empty()) << "round " << round;
    store_->Unpin(ns_, all);
    Open();
  }
  const std::vector<Key> after = Keys(10, 3);
  for (CaptureOutcome o : Store(after)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  all.insert(all.end(), after.begin(), after.end());
  ASSERT_EQ(store_->LookupAndPin(ns_, all), all.size());
  EXPECT_TRUE(Read(all).empty());
  store_->Unpin(ns_, all);
}

TEST_F(DurabilityTest, AFailedReadDropsTheBlockSoItIsStoredAgainAndServed) {
  Open();
  auto keys = Keys(0, 1);
  ASSERT_EQ(Store(keys)[0], CaptureOutcome::kDurable);
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 1u);
  // Object 0 of the first block (slot 0) lies in file 0: one transient EIO.
  ASSERT_EQ(options_.layout.ObjectLocation(0, 0).file, 0u);
  disk_->FailNext(0, io::Op::kRead, 1, EIO);
  EXPECT_EQ(Read(keys), std::vector<uint32_t>{0});
  store_->Unpin(ns_, keys);
  EXPECT_EQ(store_->Stats().io_errors, 1u);
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 0u) << "a clean miss";
  EXPECT_EQ(Store(keys, /*wait=*/false, /*version=*/1)[0], CaptureOutcome::kCaptured)
      << "not ALREADY_PRESENT: the bad block left the index";
  store_->Flush();
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 1u);
  EXPECT_TRUE(Read(keys, 1).empty());
  store_->Unpin(ns_, keys);
  disk_->SimulateCrash();  // the journal alone says which block the key names
  Open();
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 1u);
  EXPECT_TRUE(Read(keys, 1).empty());
}

TEST_F(DurabilityTest, AFailedReadIsJournaledSoARestartDoesNotBringTheBlockBack) {
  Open();
  auto keys = Keys(0, 2);
  Store(keys);
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 2u);
  const pool::Location loc = options_.layout.ObjectLocation(0, 5);
  disk_->Corrupt(loc.file, loc.offset + 7, 1);
  EXPECT_EQ(Read(keys), std::vector<uint32_t>{0});
  store_->Unpin(ns_, keys);
  EXPECT_EQ(store_->Stats().slots_used, 1u) << "the slot is freed once unpinned";
  disk_->SimulateCrash();
  Open();
  EXPECT_EQ(store_->LookupAndPin(ns_, absl::MakeSpan(keys).subspan(0, 1)), 0u);
  EXPECT_EQ(store_->Stats().verify_errors, 0u) << "never read again";
}

TEST_F(DurabilityTest, ARetiredSlotIsNotRewrittenWhileItsKeyIsPinned) {
  capacity_ = 4ull << 20;
  SetUp();
  Open();
  const uint64_t slots = options_.layout.num_slots();
  auto first = Keys(0, slots);
  for (size_t i = 0; i < first.size(); i += 32) {
    Store(absl::MakeSpan(first).subspan(i, std::min<size_t>(32, first.size() - i)));
  }
  std::vector<Key> key0 = {first[0]};
  ASSERT_EQ(store_->LookupAndPin(ns_, key0), 1u);  // reader A
  ASSERT_EQ(store_->LookupAndPin(ns_, key0), 1u);  // reader B
  const pool::Location header = options_.layout.HeaderLocation(0);
  const std::string header_before = disk_->Peek(header.file, header.offset, 4096);
  disk_->FailNext(options_.layout.ObjectLocation(0, 0).file, io::Op::kRead, 1, EIO);
  EXPECT_EQ(Read(key0), std::vector<uint32_t>{0});  // A's read fails
  store_->Unpin(ns_, key0);                         // A lets go; B still holds a pin
  // Fill the pool twice over: every other block is evicted, slot 0 stays.
  auto more = Keys(1000, 2 * slots);
  for (size_t i = 0; i < more.size(); i += 32) {
    Store(absl::MakeSpan(more).subspan(i, std::min<size_t>(32, more.size() - i)));
  }
  EXPECT_EQ(disk_->Peek(header.file, header.offset, 4096), header_before);
  EXPECT_EQ(Read(key0), std::vector<uint32_t>{0}) << "B's read: the block is gone";
  store_->Unpin(ns_, key0);
  auto last = Keys(5000, slots);
  for (size_t i = 0; i < last.size(); i += 32) {
    Store(absl::MakeSpan(last).subspan(i, std::min<size_t>(32, last.size() - i)));
  }
  EXPECT_NE(disk_->Peek(header.file, header.offset, 4096), header_before) << "reused once free";
  EXPECT_EQ(store_->Stats().slots_used, slots);
}

TEST_F(DurabilityTest, AFailingCheckpointKeepsOneJournalFileAndRetriesAfterABackOff) {
  options_.checkpoint_every = 1;
  Open();
  ASSERT_EQ(JournalFiles(), 1);
  // Creating the checkpoint's temporary file fails (EISDIR), for root too.
  fs::create_directories(state_dir_ + "/checkpoint.tmp");
  auto store = [this](uint32_t i) {
    ASSERT_EQ(Store(Keys(i, 1))[0], CaptureOutcome::kDurable);
    store_->Flush();  // the batch's checkpoint attempt, if any, is over
  };
  for (uint32_t i = 0; i < 10; ++i) store(i);
  EXPECT_LE(JournalFiles(), 2);
  EXPECT_EQ(store_->Stats().checkpoint_failures, 1u) << "no retry before the back-off";
  clock_.AdvanceMs(1000);
  store(10);
  EXPECT_EQ(store_->Stats().checkpoint_failures, 2u);
  EXPECT_LE(JournalFiles(), 2);
  fs::remove(state_dir_ + "/checkpoint.tmp");
  clock_.AdvanceMs(1000);
  store(11);
  EXPECT_EQ(store_->Stats().checkpoint_failures, 2u) << "waits for its doubled back-off";
  clock_.AdvanceMs(1000);
  store(12);
  EXPECT_EQ(store_->Stats().checkpoint_failures, 2u);
  EXPECT_EQ(JournalFiles(), 1) << "the checkpoint succeeded and removed the older file";
  EXPECT_TRUE(fs::exists(state_dir_ + "/checkpoint"));
  disk_->SimulateCrash();
  Open();
  EXPECT_EQ(store_->LookupAndPin(ns_, Keys(0, 13)), 13u);
}

TEST_F(DurabilityTest, RegisterNamespaceAndEvictDoNotWaitForABatchsPoolSync) {
  auto holding = std::make_unique<HoldingBackend>(disk_);
  HoldingBackend* backend = holding.get();
  Open(std::move(holding));
  auto evictable = Keys(0, 3);
  Store(evictable);
  backend->Arm();
  auto stuck = Keys(100, 1);
  EXPECT_EQ(Store(stuck, /*wait=*/false)[0], CaptureOutcome::kCaptured);
  ASSERT_TRUE(backend->entered().WaitForNotificationWithTimeout(kPatience));
  // The writer now waits inside its batch's pool sync.
  absl::Notification registered, evicted;
  absl::StatusOr<NamespaceId> other;
  std::pair<uint64_t, uint64_t> evict_counts;
  std::thread control([&] {
    other = store_->RegisterNamespace(TestNamespace("other"));
    registered.Notify();
    evict_counts = store_->Evict(ns_);
    evicted.Notify();
  });
  const bool registered_in_time = registered.WaitForNotificationWithTimeout(kPatience);
  const bool evicted_in_time = evicted.WaitForNotificationWithTimeout(kPatience);
  backend->release().Notify();
  control.join();
  EXPECT_TRUE(registered_in_time) << "RegisterNamespace waited for the batch's pool sync";
  EXPECT_TRUE(evicted_in_time) << "Evict waited for the batch's pool sync";
  EXPECT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(evict_counts.first, evictable.size());
  store_->Flush();
  EXPECT_EQ(store_->LookupAndPin(ns_, stuck), 1u) << "the held batch completes";
  EXPECT_TRUE(Read(stuck).empty());
}

}  // namespace
}  // namespace tutti::store
