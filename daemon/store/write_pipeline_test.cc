// The store's write pipeline (issue 20). Merged writes: blocks one Capture call starts share
// interleaved staging, so object j of blocks written to consecutive slots of one extent group,
// and slot headers adjacent in a pool file, go in one write each; they must leave exactly the
// bytes and the journal that one write per piece leaves; a failed write fails exactly the blocks
// it covered; a failed pool sync fails the whole batch. Pipelining: a batch's writes go out while
// an earlier batch's pool sync is still in progress; batches written and waiting for their commit
// do not count against write_batches_in_flight; a batch whose writes complete before an earlier
// one's never takes that one's slot-header pages.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <filesystem>
#include <fstream>
#include <sstream>

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
constexpr uint32_t kObjectLen = 4096;  // 16 tokens x 2 heads x 64 dims x 2 bytes: a whole frame
constexpr uint32_t kFrame = 4096;
constexpr uint32_t kExtentSlots = 4;   // G: object j of 4 consecutive slots are 4 adjacent frames
constexpr uint32_t kBlocks = 8;        // one extent of 2 files: slots 0-3 (group 0), 4-7 (group 1)
// The merged writes of one batch of kBlocks blocks: two per object index (one per extent group)
// and two of slot headers.
constexpr uint64_t kBatchWrites = 2 * kObjects + 2;
constexpr absl::Duration kPatience = absl::Seconds(10);  // only bounds a hang: never waited out

uint8_t ContentByte(const Key& key, uint32_t object, uint32_t offset) {
  return static_cast<uint8_t>(key.bytes[offset % 16] * 31 + object * 17 + offset / 16);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using testing::HoldingBackend;

// One store over its own memory disk and state directory.
struct TestStore {
  std::string state_dir;
  std::shared_ptr<io::MemoryDisk> disk;
  std::unique_ptr<BlockStore> store;
  NamespaceId ns = 0;
};

class WritePipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/merged_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    auto layout = pool::PoolLayout::Compute(8ull << 20, 2, kFrame, kObjects, kExtentSlots);
    ASSERT_TRUE(layout.ok()) << layout.status();
    ASSERT_EQ(layout->extent_slots(), kExtentSlots);
    options_.layout = *layout;
    options_.store_staging_bytes = 64 * kObjects * kFrame;
    options_.retrieve_staging_bytes = 64 * kObjects * kFrame;
    options_.write_batch_blocks = kBlocks;
  }
  void TearDown() override {
    stores_.clear();
    fs::remove_all(root_);
  }

  // A store over a fresh disk, through `wrap` (the memory backend over the disk by default).
  TestStore& Open(std::function<std::unique_ptr<io::IoBackend>(std::shared_ptr<io::MemoryDisk>)>
                      wrap = nullptr) {
    auto s = std::make_unique<TestStore>();
    s->state_dir = absl::StrCat(root_, "/state", stores_.size());
    fs::create_directories(s->state_dir);
    auto disk =
        io::MemoryDisk::Create({options_.layout.file_bytes(), options_.layout.file_bytes()});
    EXPECT_TRUE(disk.ok()) << disk.status();
    s->disk = *disk;
    StoreOptions options = options_;
    options.state_dir = s->state_dir;
    std::unique_ptr<io::IoBackend> backend =
        wrap ? wrap(s->disk) : io::MemoryBackend::CreateOn(s->disk);
    auto store = BlockStore::Open(options, std::move(backend), &clock_);
    EXPECT_TRUE(store.ok()) << store.status();
    s->store = std::move(store).value();
    auto ns = s->store->RegisterNamespace(testing::TestNamespace(kLayers, 2));
    EXPECT_TRUE(ns.ok()) << ns.status();
    s->ns = *ns;
    stores_.push_back(std::move(s));
    return *stores_.back();
  }

  // Stores `keys` in one Capture call (whole blocks), waiting until they are durable or failed
  // unless `wait` is false.
  static std::vector<CaptureOutcome> Store(TestStore& s, absl::Span<const Key> keys,
                                           bool wait = true) {
    std::vector<Key> copy(keys.begin(), keys.end());
    auto gather = [copy](absl::Span<const engine::CopyOp> ops) {
      for (const engine::CopyOp& op : ops) {
        for (uint32_t i = 0; i < kObjectLen; ++i)
          op.staging[i] = ContentByte(copy[op.block], op.object, i);
      }
      return absl::OkStatus();
    };
    auto out = s.store->Capture(s.ns, keys, 0, kLayers, gather, wait);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<CaptureOutcome>();
  }

  // A store over a fresh disk through a HoldingBackend, set in `*holding`.
  TestStore& OpenHolding(HoldingBackend** holding) {
    return Open([holding](std::shared_ptr<io::MemoryDisk> disk) {
      auto b = std::make_unique<HoldingBackend>(std::move(disk));
      *holding = b.get();
      return b;
    });
  }

  // The writes `s`'s disk has performed, once they are `n` or kPatience has passed.
  static uint64_t AwaitWrites(const TestStore& s, uint64_t n) {
    auto writes = [&s] { return s.disk->counts(0).writes + s.disk->counts(1).writes; };
    const absl::Time deadline = absl::Now() + kPatience;
    while (writes() < n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    return writes();
  }

  // While the first batch is held: stores `second`, waits until it is written, then `third`,
  // and asserts that it is written too (`why`: what it would have waited for otherwise).
  static void StoreTwoMoreWhileHeld(TestStore& s, absl::Span<const Key> second,
                                    absl::Span<const Key> third, const char* why) {
    const uint64_t before = AwaitWrites(s, 0);
    for (CaptureOutcome o : Store(s, second, /*wait=*/false)) {
      EXPECT_EQ(o, CaptureOutcome::kCaptured);
    }
    ASSERT_EQ(AwaitWrites(s, before + kBatchWrites), before + kBatchWrites);
    for (CaptureOutcome o : Store(s, third, /*wait=*/false)) {
      EXPECT_EQ(o, CaptureOutcome::kCaptured);
    }
    ASSERT_EQ(AwaitWrites(s, before + 2 * kBatchWrites), before + 2 * kBatchWrites)
        << "the third batch waited for " << why;
  }

  static size_t Count(const std::vector<CaptureOutcome>& out, CaptureOutcome o) {
    return std::count(out.begin(), out.end(), o);
  }

  // Which of `keys` Lookup finds (pins dropped again).
  static std::vector<bool> Visible(TestStore& s, absl::Span<const Key> keys) {
    std::vector<bool> found;
    for (const Key& k : keys) {
      const bool hit = s.store->LookupAndPin(s.ns, absl::MakeConstSpan(&k, 1)) == 1;
      if (hit) s.store->Unpin(s.ns, absl::MakeConstSpan(&k, 1));
      found.push_back(hit);
    }
    return found;
  }

  std::string root_;
  StoreOptions options_;
  ManualClock clock_;
  std::vector<std::unique_ptr<TestStore>> stores_;
};

TEST_F(WritePipelineTest, MergedWritesLeaveTheBytesAndJournalOfOneWriteEach) {
  const std::vector<Key> keys = testing::TestKeys(0, kBlocks);
  TestStore& merged = Open();
  TestStore& single = Open();
  for (CaptureOutcome o : Store(merged, keys)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  for (const Key& k : keys) EXPECT_EQ(Store(single, absl::MakeConstSpan(&k, 1))[0], CaptureOutcome::kDurable);
  uint64_t merged_writes = 0, single_writes = 0;
  for (uint32_t f = 0; f < 2; ++f) {
    const uint64_t bytes = options_.layout.file_bytes();
    EXPECT_TRUE(merged.disk->Peek(f, 0, bytes) == single.disk->Peek(f, 0, bytes)) << "file " << f;
    merged_writes += merged.disk->counts(f).writes;
    single_writes += single.disk->counts(f).writes;
  }
  // One block alone: each of its 8 objects and its header is a write of its own. Eight blocks of
  // one call: object j of each group of 4 slots is one write, and so are the 4 headers per file.
  EXPECT_EQ(single_writes, kBlocks * (kObjects + 1));
  EXPECT_EQ(merged_writes, 2 * kObjects + 2);
  const std::string journal = ReadFile(merged.state_dir + "/journal.1");
  EXPECT_FALSE(journal.empty());
  EXPECT_TRUE(journal == ReadFile(single.state_dir + "/journal.1"));
}

TEST_F(WritePipelineTest, ShortStagingSharesWhatRunsItCanAndTakesEveryBlockThatFits) {
  options_.store_staging_bytes = 5 * kObjects * kFrame;  // five blocks
  TestStore& s = Open();
  const std::vector<Key> keys = testing::TestKeys(0, kBlocks);
  const std::vector<CaptureOutcome> out = Store(s, keys);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(out[b], b < 5 ? CaptureOutcome::kDurable : CaptureOutcome::kRejectedFull) << b;
  }
  // Blocks 0-3 share a run (one write per object of slots 0-3), block 4 has its own (one write
  // per object); the headers of slots 0, 2, 4 (file 0) and 1, 3 (file 1) are a write per file.
  EXPECT_EQ(s.disk->counts(0).writes + s.disk->counts(1).writes, 2 * kObjects + 2);
  EXPECT_EQ(s.store->Stats().store_staging_used, 0u);
  EXPECT_EQ(Count(Store(s, absl::MakeSpan(keys).subspan(5)), CaptureOutcome::kDurable), 3u);
}

TEST_F(WritePipelineTest, AFailedMergedWriteFailsExactlyTheBlocksItCovered) {
  const std::vector<Key> keys = testing::TestKeys(0, kBlocks);
  TestStore& s = Open();
  // File 1's first two writes, in (offset) order: the headers of slots 1, 3, 5 and 7 (slot s's
  // header is in file s % 2), then object 0 of slots 4-7 (group 1 puts object 0 in file 1).
  s.disk->FailNext(1, io::Op::kWrite, 2, EIO);
  const std::vector<CaptureOutcome> out = Store(s, keys);
  const std::vector<bool> durable = {true, false, true, false, false, false, false, false};
  for (uint32_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(out[b], durable[b] ? CaptureOutcome::kDurable : CaptureOutcome::kFailed) << b;
  }
  EXPECT_EQ(Visible(s, keys), durable);
  EXPECT_EQ(s.store->Stats().io_errors, 6u) << "blocks, as before merging";
  for (CaptureOutcome o : Store(s, keys)) {
    EXPECT_NE(o, CaptureOutcome::kFailed) << "stored again (or already there)";
  }
  EXPECT_EQ(Visible(s, keys), std::vector<bool>(kBlocks, true));
}

TEST_F(WritePipelineTest, AFailedPoolSyncFailsTheWholeBatch) {
  const std::vector<Key> keys = testing::TestKeys(0, kBlocks);
  TestStore& s = Open();
  s.disk->FailNextSync(1, 1, EIO);
  for (CaptureOutcome o : Store(s, keys)) EXPECT_EQ(o, CaptureOutcome::kFailed);
  EXPECT_EQ(Visible(s, keys), std::vector<bool>(kBlocks, false));
  EXPECT_EQ(s.store->Stats().store_failed, kBlocks);
  for (CaptureOutcome o : Store(s, keys)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  EXPECT_EQ(Visible(s, keys), std::vector<bool>(kBlocks, true));
}

TEST_F(WritePipelineTest, ABatchIsWrittenWhileAnEarlierOneIsSynced) {
  HoldingBackend* holding = nullptr;
  TestStore& s = OpenHolding(&holding);
  const std::vector<Key> first = testing::TestKeys(0, kBlocks);
  const std::vector<Key> second = testing::TestKeys(100, kBlocks);
  holding->Arm();
  for (CaptureOutcome o : Store(s, first, /*wait=*/false)) EXPECT_EQ(o, CaptureOutcome::kCaptured);
  ASSERT_TRUE(holding->entered().WaitForNotificationWithTimeout(kPatience));
  // The first batch's pool sync is held now. The second batch is written meanwhile.
  const uint64_t before = AwaitWrites(s, 0);
  for (CaptureOutcome o : Store(s, second, /*wait=*/false)) EXPECT_EQ(o, CaptureOutcome::kCaptured);
  EXPECT_EQ(AwaitWrites(s, before + kBatchWrites), before + kBatchWrites)
      << "the second batch waited for the first's sync";
  EXPECT_EQ(Visible(s, first), std::vector<bool>(kBlocks, false)) << "not durable yet";
  holding->release().Notify();
  s.store->Flush();
  EXPECT_EQ(Visible(s, first), std::vector<bool>(kBlocks, true));
  EXPECT_EQ(Visible(s, second), std::vector<bool>(kBlocks, true));
}

// Batches written and waiting for the committer (held in an earlier batch's pool sync) leave the
// writer free: with one batch of writes in flight at most, the second and third batches are both
// written while the first one's sync is held.
TEST_F(WritePipelineTest, WrittenBatchesWaitingForTheirCommitDoNotHoldTheWriter) {
  options_.write_batches_in_flight = 1;
  HoldingBackend* holding = nullptr;
  TestStore& s = OpenHolding(&holding);
  const std::vector<Key> first = testing::TestKeys(0, kBlocks);
  const std::vector<Key> second = testing::TestKeys(100, kBlocks);
  const std::vector<Key> third = testing::TestKeys(200, kBlocks);
  holding->Arm();
  for (CaptureOutcome o : Store(s, first, /*wait=*/false)) EXPECT_EQ(o, CaptureOutcome::kCaptured);
  ASSERT_TRUE(holding->entered().WaitForNotificationWithTimeout(kPatience));
  const absl::Time held = absl::Now();
  StoreTwoMoreWhileHeld(s, second, third, "the second one's commit");
  if (HasFatalFailure()) return holding->release().Notify();  // the store can then close
  EXPECT_EQ(Visible(s, second), std::vector<bool>(kBlocks, false)) << "committed in order";
  absl::SleepFor(absl::Milliseconds(20));  // so the held sync's share of the stats shows
  const double held_s = absl::ToDoubleSeconds(absl::Now() - held);
  holding->release().Notify();
  s.store->Flush();
  for (const auto* keys : {&first, &second, &third}) {
    EXPECT_EQ(Visible(s, *keys), std::vector<bool>(kBlocks, true));
  }
  // Two commits: the first batch's, then the second and third together (both written by then).
  const StoreStats st = s.store->Stats();
  EXPECT_EQ(st.write_batches, 3u);
  EXPECT_EQ(st.write_commits, 2u);
  EXPECT_GE(st.write_commit_sync_seconds, held_s);
  EXPECT_LE(st.write_commit_sync_seconds, st.write_commit_seconds);
}

// A batch whose writes complete while an earlier batch's are still in flight gives its
// slot-header pages back, and the next batch takes those, not the earlier batch's: with two
// batches in flight at most and the first batch's header writes held, the third batch is written
// meanwhile, and every block of the three lands under its own header (a scrub checks each).
TEST_F(WritePipelineTest, ABatchNeverTakesTheHeaderPagesOfOneStillBeingWritten) {
  options_.write_batches_in_flight = 2;
  HoldingBackend* holding = nullptr;
  TestStore& s = OpenHolding(&holding);
  // The first batch's blocks take slots 0 .. kBlocks-1 of the fresh pool: hold every write to
  // them (their headers' included).
  std::vector<pool::Location> places;
  for (uint64_t slot = 0; slot < kBlocks; ++slot) {
    places.push_back(options_.layout.HeaderLocation(slot));
    for (uint32_t j = 0; j < kObjects; ++j)
      places.push_back(options_.layout.ObjectLocation(slot, j));
  }
  holding->HoldWhere([places](const io::IoRequest& r) {
    return r.op == io::Op::kWrite &&
           std::any_of(places.begin(), places.end(), [&r](const pool::Location& p) {
             return p.file == r.file && p.offset >= r.offset && p.offset < r.offset + r.len;
           });
  });
  const std::vector<Key> first = testing::TestKeys(0, kBlocks);
  const std::vector<Key> second = testing::TestKeys(100, kBlocks);
  const std::vector<Key> third = testing::TestKeys(200, kBlocks);
  for (CaptureOutcome o : Store(s, first, /*wait=*/false)) EXPECT_EQ(o, CaptureOutcome::kCaptured);
  ASSERT_TRUE(holding->writes_held().WaitForNotificationWithTimeout(kPatience));
  StoreTwoMoreWhileHeld(s, second, third, "the first one's writes");  // those are all held
  if (HasFatalFailure()) return holding->ReleaseWrites();  // the store can then close
  EXPECT_EQ(Visible(s, third), std::vector<bool>(kBlocks, false)) << "committed in order";
  holding->ReleaseWrites();
  s.store->Flush();
  std::vector<Key> all;
  for (const auto* keys : {&first, &second, &third}) {
    EXPECT_EQ(Visible(s, *keys), std::vector<bool>(kBlocks, true));
    all.insert(all.end(), keys->begin(), keys->end());
  }
  auto scrub = s.store->Scrub(ScrubOptions{8}, nullptr);
  ASSERT_TRUE(scrub.ok()) << scrub.status();
  EXPECT_EQ(scrub->blocks_checked, all.size());
  EXPECT_EQ(scrub->blocks_bad, 0u);
}

// With checksum threads (the batches' checksums spread over them), every block of several batches
// lands whole under its own checksums (a scrub reads and checks each), and the prepare time splits
// into slots and checksums.
TEST_F(WritePipelineTest, BatchesChecksummedOnThePoolLandWhole) {
  options_.checksum_threads = 3;
  TestStore& s = Open();
  constexpr uint32_t kBatches = 6;
  std::vector<Key> all;
  for (uint32_t b = 0; b < kBatches; ++b) {
    const std::vector<Key> keys = testing::TestKeys(1000 * (b + 1), kBlocks);
    for (CaptureOutcome o : Store(s, keys, /*wait=*/false)) {
      EXPECT_EQ(o, CaptureOutcome::kCaptured);
    }
    all.insert(all.end(), keys.begin(), keys.end());
  }
  s.store->Flush();
  EXPECT_EQ(Visible(s, all), std::vector<bool>(all.size(), true));
  auto scrub = s.store->Scrub(ScrubOptions{8}, nullptr);
  ASSERT_TRUE(scrub.ok()) << scrub.status();
  EXPECT_EQ(scrub->blocks_checked, all.size());
  EXPECT_EQ(scrub->blocks_bad, 0u);
  const StoreStats st = s.store->Stats();
  EXPECT_EQ(st.blocks_stored, all.size());
  EXPECT_GE(st.write_batches, kBatches);
  EXPECT_GT(st.write_checksum_seconds, 0);
  EXPECT_LE(st.write_slot_seconds + st.write_checksum_seconds, st.write_prepare_seconds + 1e-9);
}

}  // namespace
}  // namespace tutti::store
