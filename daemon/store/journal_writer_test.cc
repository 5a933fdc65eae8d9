#include "daemon/store/journal_writer.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fault_file_system.h"
#include "common/file_system.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

using Op = FaultFileSystem::Op;

Key MakeKey(uint64_t n) {
  Key k;
  for (int i = 0; i < 16; ++i) k.bytes[i] = static_cast<uint8_t>(n * 31 + i);
  return k;
}

DeleteRecord Delete(uint64_t n) { return {1, MakeKey(n), n, 1000 + n}; }

// The slots of the deletes recovery replays, in order; namespaces as 1000000 + id.
struct Replayed {
  std::vector<uint64_t> order;
  RecoveryVisitor visitor() {
    RecoveryVisitor v;
    v.on_namespace = [this](const NamespaceRecord& r) { order.push_back(1000000 + r.ns); };
    v.on_delete = [this](const DeleteRecord& r) { order.push_back(r.slot); };
    v.on_put = [this](const PutRecord& r) { order.push_back(2000000 + r.slot); };
    return v;
  }
};

class JournalWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* t = std::getenv("TEST_TMPDIR");
    std::string tmpl = absl::StrCat(t != nullptr ? t : "/tmp", "/jwriter-XXXXXX");
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<JournalWriter> Open(Replayed* out, FileSystem* fs = PosixFileSystem()) {
    RecoveryReport report;
    auto j = Journal::Open(dir_, out->visitor(), &report, fs);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? std::make_unique<JournalWriter>(std::move(*j)) : nullptr;
  }

  std::string dir_;
};

TEST_F(JournalWriterTest, RecordsFromManyThreadsAreDurableInQueueOrder) {
  Replayed none;
  auto w = Open(&none);
  constexpr int kThreads = 4, kEach = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const uint64_t seq = w->Append(Delete(t * kEach + i));
        if (i % 50 == 49) {
          EXPECT_TRUE(w->Sync(seq).ok());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(w->Sync().ok());
  EXPECT_EQ(w->records_since_checkpoint(), uint64_t{kThreads * kEach});
  w.reset();
  Replayed r;
  Open(&r);
  ASSERT_EQ(r.order.size(), size_t{kThreads * kEach});
  // Each thread's records come back in the order it queued them.
  std::vector<int> next(kThreads, 0);
  for (uint64_t slot : r.order) {
    const int t = static_cast<int>(slot / kEach);
    EXPECT_EQ(slot, uint64_t(t * kEach + next[t]++));
  }
}

TEST_F(JournalWriterTest, SequenceNumbersAreTheJournals) {
  Replayed none;
  auto w = Open(&none);
  EXPECT_EQ(w->Append(Delete(1)), 1u);
  EXPECT_EQ(w->Append(NamespaceDropRecord{7}), 2u);
  EXPECT_EQ(w->Append(Delete(2)), 3u);
  EXPECT_TRUE(w->Sync(3).ok());
}

TEST_F(JournalWriterTest, ApplyRunsAfterAnOkSyncAndBeforeALaterCheckpoint) {
  Replayed none;
  auto w = Open(&none);
  bool applied = false;
  const uint64_t seq = w->Append(NamespaceRecord{5, "descriptor"});
  ASSERT_TRUE(w->SyncAndApply(seq, [&] { applied = true; }).ok());
  EXPECT_TRUE(applied);
  bool seen = false;
  ASSERT_TRUE(w->Checkpoint([&](Journal::Emitter& out) {
                 seen = applied;
                 out.Emit(NamespaceRecord{5, "descriptor"});
               }).ok());
  EXPECT_TRUE(seen);
  EXPECT_EQ(w->records_since_checkpoint(), 0u);
  w.reset();
  Replayed r;
  Open(&r);
  EXPECT_EQ(r.order, std::vector<uint64_t>{1000005});
}

TEST_F(JournalWriterTest, AFailedSyncIsReportedToEveryWaiterAndAppliesNothing) {
  FaultFileSystem faulty;
  Replayed none;
  auto w = Open(&none, &faulty);
  faulty.Inject(FaultFileSystem::Fail(Op::kSync, EIO).On("journal."));
  const uint64_t a = w->Append(Delete(1));
  bool applied = false;
  const absl::Status s = w->SyncAndApply(a, [&] { applied = true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_FALSE(applied);
  // The record's write failed for good: a later Sync of it says so, even after others succeed.
  const uint64_t b = w->Append(Delete(2));
  EXPECT_TRUE(w->Sync(b).ok());
  EXPECT_EQ(w->Sync(a).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(w->durability().ok());
}

}  // namespace
}  // namespace tutti::store
