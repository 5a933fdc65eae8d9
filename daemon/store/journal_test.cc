#include "daemon/store/journal.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fault_file_system.h"
#include "common/file_system.h"
#include "gtest/gtest.h"
#include "xxhash.h"

namespace tutti::store {
namespace {

namespace fs = std::filesystem;
using Op = FaultFileSystem::Op;

Key MakeKey(uint64_t n) {
  Key k;
  for (int i = 0; i < 16; ++i) k.bytes[i] = static_cast<uint8_t>(n * 31 + i);
  return k;
}

PutRecord Put(uint64_t n, size_t objects = 4) {
  PutRecord r;
  r.ns = 1 + n % 2;
  r.key = MakeKey(n);
  r.slot = 100 + n;
  r.epoch = 1000 + n;
  r.object_len = 32768;
  for (size_t i = 0; i < objects; ++i) r.checksums.push_back(n << 16 | i);
  return r;
}

DeleteRecord Delete(uint64_t n) { return {1 + n % 2, MakeKey(n), 100 + n, 1000 + n}; }
NamespaceRecord Ns(uint64_t id) {
  return {id, absl::StrCat("descriptor-", id, std::string(3, '\0'))};
}

std::string Str(const NamespaceRecord& r) { return absl::StrCat("ns ", r.ns, " ", r.descriptor); }
std::string Str(const PutRecord& r) {
  return absl::StrCat("put ", r.ns, " ", r.key.Hex(), " ", r.slot, " ", r.epoch, " ", r.object_len,
                      " [", absl::StrJoin(r.checksums, ","), "]");
}
std::string Str(const DeleteRecord& r) {
  return absl::StrCat("del ", r.ns, " ", r.key.Hex(), " ", r.slot, " ", r.epoch);
}

// Records what recovery delivers, as strings.
struct Recovered {
  std::vector<std::string> records;
  RecoveryReport report;
  RecoveryVisitor visitor() {
    return {[this](const NamespaceRecord& r) { records.push_back(Str(r)); },
            [this](const PutRecord& r) { records.push_back(Str(r)); },
            [this](const DeleteRecord& r) { records.push_back(Str(r)); }};
  }
};

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* t = std::getenv("TEST_TMPDIR");
    std::string tmpl = absl::StrCat(t != nullptr ? t : "/tmp", "/journal-XXXXXX");
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = NewDir("state");
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string NewDir(const std::string& name) {
    const std::string d = root_ + "/" + name;
    fs::create_directories(d);
    return d;
  }

  // Opens `dir` (through `fs`), expecting success; fills `*out` with what was recovered.
  std::unique_ptr<Journal> Open(const std::string& dir, Recovered* out,
                                FileSystem* fs = PosixFileSystem()) {
    auto j = Journal::Open(dir, out->visitor(), &out->report, fs);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? *std::move(j) : nullptr;
  }

  // The files of `dir` but the state lock (StateDirectoryLock* tests look at that one).
  std::vector<std::string> Files(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename() != "lock") names.push_back(e.path().filename());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string root_, dir_;
};

TEST_F(JournalTest, FreshDirectoryStartsAtGenerationOne) {
  Recovered r;
  auto j = Open(dir_, &r);
  ASSERT_NE(j, nullptr);
  EXPECT_TRUE(r.records.empty());
  EXPECT_EQ(r.report.generation, 1u);
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"journal.1"}));
  EXPECT_EQ(Journal::Open(root_ + "/missing", {}, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JournalTest, AppendSyncReopenReplaysInOrder) {
  std::vector<std::string> want;
  {
    Recovered r;
    auto j = Open(dir_, &r);
    ASSERT_NE(j, nullptr);
    j->Append(Ns(1));
    j->Append(Ns(2));
    want = {Str(Ns(1)), Str(Ns(2))};
    for (uint64_t n = 0; n < 50; ++n) {
      j->Append(Put(n, n % 7));
      want.push_back(Str(Put(n, n % 7)));
      if (n % 5 == 4) {
        j->Append(Delete(n - 2));
        want.push_back(Str(Delete(n - 2)));
      }
      if (n % 10 == 9) {
        ASSERT_TRUE(j->Sync().ok());
      }
    }
    EXPECT_EQ(j->records_since_checkpoint(), want.size());
    j->Append(Put(999));  // never synced: not durable, and not replayed
  }
  Recovered r;
  auto j = Open(dir_, &r);
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(r.records, want);
  EXPECT_EQ(r.report.records, want.size());
  EXPECT_EQ(r.report.torn_tails, 0u);
  EXPECT_EQ(r.report.generation, 2u);
  // The fresh generation appends; the next recovery reads both files.
  j->Append(Put(77, 496));
  ASSERT_TRUE(j->Sync().ok());
  j.reset();
  Recovered again;
  ASSERT_NE(Open(dir_, &again), nullptr);
  want.push_back(Str(Put(77, 496)));
  EXPECT_EQ(again.records, want);
}

TEST_F(JournalTest, TornTailAtEveryByteOfTheLastRecordKeepsAllEarlierRecords) {
  std::vector<std::string> earlier;
  uint64_t before = 0, after = 0;
  {
    Recovered r;
    auto j = Open(dir_, &r);
    j->Append(Ns(1));
    for (uint64_t n = 0; n < 3; ++n) j->Append(Put(n));
    ASSERT_TRUE(j->Sync().ok());
    earlier = {Str(Ns(1)), Str(Put(0)), Str(Put(1)), Str(Put(2))};
    before = fs::file_size(dir_ + "/journal.1");
    j->Append(Put(3, 9));
    ASSERT_TRUE(j->Sync().ok());
    after = fs::file_size(dir_ + "/journal.1");
  }
  ASSERT_GT(after, before);
  for (uint64_t cut = before; cut <= after; ++cut) {
    SCOPED_TRACE(testing::Message() << "cut at " << cut);
    const std::string copy = NewDir(absl::StrCat("cut", cut));
    fs::copy_file(dir_ + "/journal.1", copy + "/journal.1");
    fs::resize_file(copy + "/journal.1", cut);
    Recovered r;
    ASSERT_NE(Open(copy, &r), nullptr);
    if (cut == after) {
      EXPECT_EQ(r.records.size(), 5u);
      EXPECT_EQ(r.report.torn_tails, 0u);
    } else {
      EXPECT_EQ(r.records, earlier);
      EXPECT_EQ(r.report.torn_tails, cut > before ? 1u : 0u);
    }
    fs::remove_all(copy);
  }
}

TEST_F(JournalTest, CorruptRecordEndsItsFileButLaterFilesAreRead) {
  {
    Recovered r;
    auto j = Open(dir_, &r);
    for (uint64_t n = 0; n < 3; ++n) j->Append(Put(n));
    ASSERT_TRUE(j->Sync().ok());
  }
  // Flip one byte inside the second record's payload.
  const std::string j1 = dir_ + "/journal.1";
  const uint64_t size = fs::file_size(j1);
  {
    std::fstream f(j1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - size / 3));
    f.put('\x5A');
  }
  {
    Recovered r;
    auto j = Open(dir_, &r);  // generation 2
    EXPECT_EQ(r.report.torn_tails, 1u);
    EXPECT_LT(r.records.size(), 3u);
    j->Append(Put(10));
    ASSERT_TRUE(j->Sync().ok());
  }
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr);
  ASSERT_FALSE(r.records.empty());
  EXPECT_EQ(r.records.back(), Str(Put(10)));
  EXPECT_EQ(r.records.front(), Str(Put(0)));
}

// Writes a live state: namespaces 1 and 2, puts 0..19 minus deleted ones,
// through `j`.
void Snapshot(Journal::Emitter& e, const std::vector<uint64_t>& live) {
  e.Emit(Ns(1));
  e.Emit(Ns(2));
  for (uint64_t n : live) e.Emit(Put(n));
}

TEST_F(JournalTest, CheckpointThenLaterJournal) {
  std::vector<uint64_t> live;
  {
    Recovered r;
    auto j = Open(dir_, &r);
    j->Append(Ns(1));
    j->Append(Ns(2));
    for (uint64_t n = 0; n < 20; ++n) j->Append(Put(n));
    for (uint64_t n = 0; n < 20; n += 3) j->Append(Delete(n));
    for (uint64_t n = 0; n < 20; ++n) {
      if (n % 3 != 0) live.push_back(n);
    }
    ASSERT_TRUE(j->Sync().ok());
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, live); }).ok());
    EXPECT_EQ(j->records_since_checkpoint(), 0u);
    EXPECT_EQ(Files(dir_), (std::vector<std::string>{"checkpoint", "journal.2"}));
    j->Append(Put(50));
    j->Append(Delete(1));
    ASSERT_TRUE(j->Sync().ok());
  }
  std::vector<std::string> want = {Str(Ns(1)), Str(Ns(2))};
  for (uint64_t n : live) want.push_back(Str(Put(n)));
  want.push_back(Str(Put(50)));
  want.push_back(Str(Delete(1)));
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr);
  EXPECT_EQ(r.records, want);
  EXPECT_EQ(r.report.generation, 3u);
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"checkpoint", "journal.2", "journal.3"}));
}

TEST_F(JournalTest, CorruptOrTruncatedCheckpointIsDataLoss) {
  {
    Recovered r;
    auto j = Open(dir_, &r);
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, {1, 2, 3, 4}); }).ok());
  }
  const std::string ckpt = dir_ + "/checkpoint";
  const std::string saved = root_ + "/checkpoint.saved";
  fs::copy_file(ckpt, saved);
  const uint64_t size = fs::file_size(ckpt);
  for (uint64_t at : {uint64_t{3}, size / 2, size - 1}) {
    fs::copy_file(saved, ckpt, fs::copy_options::overwrite_existing);
    std::fstream f(ckpt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x10));
    f.close();
    Recovered r;
    auto j = Journal::Open(dir_, r.visitor(), &r.report);
    EXPECT_EQ(j.status().code(), absl::StatusCode::kDataLoss) << "byte " << at;
  }
  // Cut off the end record: still DATA_LOSS, never a partial index.
  fs::copy_file(saved, ckpt, fs::copy_options::overwrite_existing);
  fs::resize_file(ckpt, size - 24);
  Recovered r;
  EXPECT_EQ(Journal::Open(dir_, r.visitor(), &r.report).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(JournalTest, CrashBetweenNewGenerationAndCheckpointRenameRecoversEverything) {
  std::vector<std::string> want = {Str(Ns(1))};
  {
    Recovered r;
    auto j = Open(dir_, &r);
    j->Append(Ns(1));
    for (uint64_t n = 0; n < 10; ++n) {
      j->Append(Put(n));
      want.push_back(Str(Put(n)));
    }
    ASSERT_TRUE(j->Sync().ok());
  }
  // Build the state a crash leaves inside Checkpoint, after journal.3 was
  // created and before checkpoint.tmp was renamed: copy the files as they were,
  // then do the real checkpoint elsewhere and take its new journal file and
  // half of its checkpoint as the temporary file.
  const std::string crashed = NewDir("crashed");
  for (const auto& f : Files(dir_)) fs::copy_file(dir_ + "/" + f, crashed + "/" + f);
  {
    Recovered r;
    auto j = Open(dir_, &r);  // generation 2
    fs::copy_file(dir_ + "/journal.2", crashed + "/journal.2");
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) {
                   e.Emit(Ns(1));
                   for (uint64_t n = 0; n < 10; ++n) e.Emit(Put(n));
                 }).ok());  // generation 3
  }
  fs::copy_file(dir_ + "/journal.3", crashed + "/journal.3");
  fs::copy_file(dir_ + "/checkpoint", crashed + "/checkpoint.tmp");
  fs::resize_file(crashed + "/checkpoint.tmp", fs::file_size(crashed + "/checkpoint.tmp") / 2);
  {
    Recovered r;
    auto j = Open(crashed, &r);
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(r.records, want);
    EXPECT_EQ(r.report.generation, 4u);
    j->Append(Put(11));
    ASSERT_TRUE(j->Sync().ok());
  }
  Recovered r;
  ASSERT_NE(Open(crashed, &r), nullptr);
  want.push_back(Str(Put(11)));
  EXPECT_EQ(r.records, want);
  EXPECT_EQ(Files(crashed), (std::vector<std::string>{"journal.1", "journal.2", "journal.3",
                                                      "journal.4", "journal.5"}));
}

TEST_F(JournalTest, CrashAfterRenameBeforeCleanupDoesNotReplayOldFilesTwice) {
  std::vector<std::string> want = {Str(Ns(1)), Str(Put(1))};
  {
    Recovered r;
    auto j = Open(dir_, &r);
    j->Append(Ns(1));
    j->Append(Put(1));
    ASSERT_TRUE(j->Sync().ok());
  }
  fs::copy_file(dir_ + "/journal.1", root_ + "/journal.1.saved");
  {
    Recovered r;
    auto j = Open(dir_, &r);
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) {
                   e.Emit(Ns(1));
                   e.Emit(Put(1));
                 }).ok());
  }
  fs::copy_file(root_ + "/journal.1.saved",
                dir_ + "/journal.1");  // the unlink never happened
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr);
  EXPECT_EQ(r.records, want);
  EXPECT_FALSE(fs::exists(dir_ + "/journal.1")) << "superseded files are removed";
}

TEST_F(JournalTest, MissingJournalFileIsDataLoss) {
  for (int i = 0; i < 3; ++i) {
    Recovered r;
    auto j = Open(dir_, &r);
    j->Append(Put(i));
    ASSERT_TRUE(j->Sync().ok());
  }
  fs::remove(dir_ + "/journal.2");
  Recovered r;
  auto gap = Journal::Open(dir_, r.visitor(), &r.report);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kDataLoss) << gap.status();
  fs::remove(dir_ + "/journal.1");  // now it starts at 3 without a checkpoint
  gap = Journal::Open(dir_, r.visitor(), &r.report);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kDataLoss) << gap.status();
}

TEST_F(JournalTest, RepeatedCheckpointsKeepOnlyTheLiveState) {
  Recovered r0;
  auto j = Open(dir_, &r0);
  std::vector<uint64_t> live;
  for (uint64_t round = 0; round < 5; ++round) {
    for (uint64_t n = round * 10; n < round * 10 + 10; ++n) {
      j->Append(Put(n));
      live.push_back(n);
    }
    ASSERT_TRUE(j->Sync().ok());
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, live); }).ok());
  }
  j.reset();
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr);
  EXPECT_EQ(r.records.size(), 2 + live.size());
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"checkpoint", "journal.6", "journal.7"}));
}

TEST_F(JournalTest, FailedSyncAbandonsTheFileAndLaterRecordsSurvive) {
  FaultFileSystem faulty;
  Recovered r0;
  auto j = Open(dir_, &r0, &faulty);
  j->Append(Put(1));
  ASSERT_TRUE(j->Sync().ok());
  // The file grows by only 100 more bytes (the file size limit): the next Sync
  // writes part of its records and fails.
  faulty.Inject(FaultFileSystem::Fail(Op::kAppend, EFBIG).ShortWrite(100));
  j->Append(Put(2, 40));
  j->Append(Put(3, 40));
  const absl::Status failed = j->Sync();
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_EQ(ErrnoOf(failed), EFBIG) << failed;
  // Appends go on, in a new generation, and recovery still reads them after the
  // torn file.
  j->Append(Put(4));
  ASSERT_TRUE(j->Sync().ok());
  j.reset();
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"journal.1", "journal.2"}));
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr);
  EXPECT_EQ(r.records, (std::vector<std::string>{Str(Put(1)), Str(Put(4))}));
  EXPECT_EQ(r.report.torn_tails, 1u);
}

TEST_F(JournalTest, StateDirectoryLockRefusesASecondOpenNamingTheHolder) {
  Recovered r1;
  auto first = Open(dir_, &r1);
  ASSERT_NE(first, nullptr);
  Recovered r2;
  auto second = Journal::Open(dir_, r2.visitor(), &r2.report);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find(dir_), std::string::npos) << second.status();
  EXPECT_NE(second.status().message().find(absl::StrCat("pid ", getpid())), std::string::npos)
      << second.status();
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"journal.1"}))
      << "the refused open wrote nothing";
  // The holder is unaffected, and its lock goes with it.
  first->Append(Put(1));
  ASSERT_TRUE(first->Sync().ok());
  first.reset();
  Recovered r3;
  ASSERT_NE(Open(dir_, &r3), nullptr);
  EXPECT_EQ(r3.records, (std::vector<std::string>{Str(Put(1))}));
}

TEST_F(JournalTest, DeletedJournalFileLosesDurabilityForGood) {
  Recovered r;
  auto j = Open(dir_, &r);
  const uint64_t kept = j->Append(Put(1));
  ASSERT_TRUE(j->Sync(kept).ok());
  EXPECT_TRUE(j->durability().ok());
  fs::remove(dir_ + "/journal.1");
  const uint64_t seq = j->Append(Put(2));
  const absl::Status s = j->Sync(seq);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(dir_ + "/journal.1"), std::string::npos) << s;
  EXPECT_EQ(j->durability().code(), absl::StatusCode::kFailedPrecondition);
  j->Append(Put(3));
  EXPECT_EQ(j->Sync().code(), absl::StatusCode::kFailedPrecondition) << "sticky";
  EXPECT_FALSE(j->Checkpoint([](Journal::Emitter&) {}).ok());
}

TEST_F(JournalTest, RemovedOrReplacedStateDirectoryLosesDurability) {
  for (bool replace : {false, true}) {
    Recovered r;
    auto j = Open(dir_, &r);
    j->Append(Put(1));
    ASSERT_TRUE(j->Sync().ok());
    fs::remove_all(dir_);
    if (replace) fs::create_directories(dir_);  // an empty directory where the state was
    j->Append(Put(2));
    EXPECT_EQ(j->Sync().code(), absl::StatusCode::kFailedPrecondition) << replace;
    EXPECT_FALSE(j->durability().ok());
    j.reset();
    fs::create_directories(dir_);
  }
}

TEST_F(JournalTest, SyncOfALostRecordFailsEvenAfterALaterSyncSucceeds) {
  FaultFileSystem faulty;
  Recovered r0;
  auto j = Open(dir_, &r0, &faulty);
  faulty.Inject(FaultFileSystem::Fail(Op::kAppend, EFBIG).ShortWrite(50));
  const uint64_t lost = j->Append(Put(2, 40));
  const absl::Status failed = j->Sync(lost);
  ASSERT_FALSE(failed.ok());
  const uint64_t later = j->Append(Put(3));
  ASSERT_TRUE(j->Sync(later).ok());
  EXPECT_EQ(j->Sync(lost).code(), failed.code()) << "the lost record is never reported durable";
  EXPECT_TRUE(j->durability().ok()) << "a write error is not a lost state directory";
}

TEST_F(JournalTest, FailingCheckpointAddsAtMostOneJournalFileAndARetryRecoversEverything) {
  Recovered r0;
  auto j = Open(dir_, &r0);
  // A directory where the checkpoint's temporary file goes: creating it fails
  // (EISDIR) even for root, which ignores permission bits.
  fs::create_directories(dir_ + "/checkpoint.tmp");
  std::vector<uint64_t> live;
  for (uint64_t n = 0; n < 5; ++n) {
    j->Append(Put(n));
    live.push_back(n);
    ASSERT_TRUE(j->Sync().ok());
    const absl::Status s = j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, live); });
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("checkpoint.tmp"), std::string::npos) << s;
  }
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"checkpoint.tmp", "journal.1", "journal.2"}));
  EXPECT_EQ(j->records_since_checkpoint(), 5u);
  fs::remove(dir_ + "/checkpoint.tmp");
  ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, live); }).ok());
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"checkpoint", "journal.2"}));
  EXPECT_EQ(j->records_since_checkpoint(), 0u);
  j->Append(Put(9));
  ASSERT_TRUE(j->Sync().ok());
  j.reset();
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr);
  // The checkpoint (namespaces 1 and 2, puts 0..4), then journal.2 replayed over it.
  std::vector<std::string> want = {Str(Ns(1)), Str(Ns(2))};
  for (uint64_t n : live) want.push_back(Str(Put(n)));
  for (uint64_t n = 1; n < 5; ++n) want.push_back(Str(Put(n)));
  want.push_back(Str(Put(9)));
  EXPECT_EQ(r.records, want);
}

// --- Faults a real disk can produce, injected through the file-system seam ---

// A failed fdatasync (EIO) abandons the file: the error is reported (again for every record of
// that write), nothing is appended to that file any more, and what recovery finds of the failed
// write is whole records or nothing.
TEST_F(JournalTest, FailedFdatasyncIsReportedAndItsFileAbandoned) {
  FaultFileSystem faulty;
  Recovered r0;
  auto j = Open(dir_, &r0, &faulty);
  j->Append(Put(1));
  ASSERT_TRUE(j->Sync().ok());
  faulty.Inject(FaultFileSystem::Fail(Op::kSync, EIO).On("journal.1"));
  const uint64_t lost = j->Append(Put(2));
  const absl::Status failed = j->Sync(lost);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_EQ(ErrnoOf(failed), EIO) << failed;
  EXPECT_NE(failed.message().find("fdatasync " + dir_ + "/journal.1"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find(std::strerror(EIO)), std::string::npos) << failed;
  EXPECT_EQ(j->Sync(lost), failed) << "asked again: still not durable";
  EXPECT_TRUE(j->durability().ok()) << "an I/O error is not a lost state directory";
  const uint64_t abandoned_size = fs::file_size(dir_ + "/journal.1");
  j->Append(Put(3));
  ASSERT_TRUE(j->Sync().ok());
  EXPECT_EQ(fs::file_size(dir_ + "/journal.1"), abandoned_size) << "nothing more goes there";
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"journal.1", "journal.2"}));
  j.reset();
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr);
  EXPECT_EQ(r.report.torn_tails, 0u);
  // The failed record may be found (its bytes reached the file): the store never published it
  // and tolerates it (JOURNAL.md "Rules for the store"); never a part of it.
  std::vector<std::string> want = {Str(Put(1)), Str(Put(2)), Str(Put(3))};
  if (r.records.size() == 2) want.erase(want.begin() + 1);
  EXPECT_EQ(r.records, want);
}

// A write that ends short on a full disk, cut at any point of a two-record batch: the Sync is
// RESOURCE_EXHAUSTED, and recovery applies the records written whole and never a part of one.
TEST_F(JournalTest, ShortWriteOnAFullDiskNeverReplaysHalfARecord) {
  uint64_t len = 0;  // one Put(n, 40) record
  {
    Recovered r;
    const std::string d = NewDir("measure");
    auto j = Open(d, &r);
    const uint64_t header = fs::file_size(d + "/journal.1");
    j->Append(Put(2, 40));
    ASSERT_TRUE(j->Sync().ok());
    len = fs::file_size(d + "/journal.1") - header;
  }
  for (uint64_t cut :
       {uint64_t{0}, uint64_t{1}, uint64_t{8}, len - 1, len, len + 1, 2 * len - 1, 2 * len}) {
    SCOPED_TRACE(testing::Message() << "cut at " << cut << " of " << 2 * len);
    const std::string d = NewDir(absl::StrCat("short", cut));
    FaultFileSystem faulty;
    Recovered r0;
    auto j = Open(d, &r0, &faulty);
    j->Append(Put(1));
    ASSERT_TRUE(j->Sync().ok());
    faulty.Inject(FaultFileSystem::Fail(Op::kAppend, ENOSPC).ShortWrite(cut));
    j->Append(Put(2, 40));
    j->Append(Put(3, 40));
    const absl::Status failed = j->Sync();
    EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
    EXPECT_NE(failed.message().find(std::strerror(ENOSPC)), std::string::npos) << failed;
    j->Append(Put(4));
    ASSERT_TRUE(j->Sync().ok());
    j.reset();
    Recovered r;
    ASSERT_NE(Open(d, &r), nullptr);
    std::vector<std::string> want = {Str(Put(1))};
    if (cut >= len) want.push_back(Str(Put(2, 40)));
    if (cut >= 2 * len) want.push_back(Str(Put(3, 40)));
    want.push_back(Str(Put(4)));
    EXPECT_EQ(r.records, want);
    EXPECT_EQ(r.report.torn_tails, cut % len == 0 ? 0u : 1u);
    fs::remove_all(d);
  }
}

// Creating the generation after an abandoned file fails (ENOSPC on create, EIO on the directory's
// fsync): the Sync reports it, leaves no half-made file, and the next Sync creates it.
TEST_F(JournalTest, FailureToStartTheNextGenerationIsReportedAndRetried) {
  FaultFileSystem faulty;
  Recovered r0;
  auto j = Open(dir_, &r0, &faulty);
  j->Append(Put(1));
  ASSERT_TRUE(j->Sync().ok());
  faulty.Inject(FaultFileSystem::Fail(Op::kSync, EIO).On("journal.1"));
  j->Append(Put(2));
  ASSERT_FALSE(j->Sync().ok());
  faulty.Inject(FaultFileSystem::Fail(Op::kCreate, ENOSPC).On("journal.2"));
  const uint64_t lost_to_create = j->Append(Put(3));
  EXPECT_EQ(j->Sync(lost_to_create).code(), absl::StatusCode::kResourceExhausted);
  faulty.Inject(FaultFileSystem::Fail(Op::kSyncDir, EIO));
  const uint64_t lost_to_dir = j->Append(Put(4));
  const absl::Status s = j->Sync(lost_to_dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("fsync " + dir_), std::string::npos) << s;
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"journal.1"})) << "journal.2 was removed";
  j->Append(Put(5));
  ASSERT_TRUE(j->Sync().ok());
  EXPECT_EQ(j->Sync(lost_to_create).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(j->Sync(lost_to_dir).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"journal.1", "journal.2"}));
  j.reset();
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr);
  ASSERT_GE(r.records.size(), 2u);
  EXPECT_EQ(r.records.front(), Str(Put(1)));
  EXPECT_EQ(r.records.back(), Str(Put(5)));
  EXPECT_LE(r.records.size(), 3u) << "only the record of the failed fdatasync may be found";
}

// A failure after the next generation's file was created (its fstat) must not leave that file
// behind: the retry creates it again (O_EXCL), and would otherwise fail for ever with EEXIST,
// both for Sync after an abandoned file and for Checkpoint's new generation.
TEST_F(JournalTest, FailureAfterCreatingAGenerationDoesNotBlockItsRetry) {
  FaultFileSystem faulty;
  Recovered r0;
  auto j = Open(dir_, &r0, &faulty);
  faulty.Inject(FaultFileSystem::Fail(Op::kSync, EIO).On("journal.1"));
  j->Append(Put(1));
  ASSERT_FALSE(j->Sync().ok());
  faulty.Inject(FaultFileSystem::Fail(Op::kFileStat, EIO).On("journal.2"));
  j->Append(Put(2));
  ASSERT_FALSE(j->Sync().ok());
  j->Append(Put(3));
  const absl::Status retried = j->Sync();
  EXPECT_TRUE(retried.ok()) << retried;
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"journal.1", "journal.2"}));

  faulty.Inject(FaultFileSystem::Fail(Op::kFileStat, EIO).On("journal.3"));
  EXPECT_FALSE(j->Checkpoint([&](Journal::Emitter& e) { e.Emit(Put(3)); }).ok());
  const absl::Status again = j->Checkpoint([&](Journal::Emitter& e) { e.Emit(Put(3)); });
  EXPECT_TRUE(again.ok()) << again;
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"checkpoint", "journal.3"}));
  j->Append(Put(4));
  ASSERT_TRUE(j->Sync().ok());
  j.reset();
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr);
  EXPECT_EQ(r.records, (std::vector<std::string>{Str(Put(3)), Str(Put(4))}));
}

// Every way writing the checkpoint can fail (a short write, fdatasync, the rename, the directory's
// fsync after it): Checkpoint reports it and leaves no temporary file; a crash at that point
// recovers every record; the retry writes the checkpoint without another journal file.
TEST_F(JournalTest, CheckpointFaultsAreReportedAndRecoverable) {
  struct Case {
    const char* name;
    FaultFileSystem::Fault fault;
    const char* message;  // in the error
  };
  const Case cases[] = {
      {"short write", FaultFileSystem::Fail(Op::kAppend, ENOSPC).On("checkpoint.tmp").ShortWrite(9),
       "write "},
      {"fdatasync", FaultFileSystem::Fail(Op::kSync, EIO).On("checkpoint.tmp"), "fdatasync "},
      {"rename", FaultFileSystem::Fail(Op::kRename, EIO), "rename "},
      // The first directory fsync is that of journal.3's creation.
      {"directory fsync", FaultFileSystem::Fail(Op::kSyncDir, EIO).Skip(1), "fsync "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string d = NewDir(absl::StrCat("ckpt-", c.name));
    FaultFileSystem faulty;
    Recovered r0;
    auto j = Open(d, &r0, &faulty);
    j->Append(Ns(1));
    j->Append(Ns(2));
    std::vector<uint64_t> live;
    for (uint64_t n = 0; n < 4; ++n) {
      j->Append(Put(n));
      live.push_back(n);
    }
    ASSERT_TRUE(j->Sync().ok());
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, live); }).ok());
    j->Append(Put(4));
    live.push_back(4);
    ASSERT_TRUE(j->Sync().ok());
    faulty.Inject(c.fault);
    const absl::Status s = j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, live); });
    EXPECT_FALSE(s.ok());
    EXPECT_NE(ErrnoOf(s), 0) << s;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s;
    EXPECT_EQ(Files(d), (std::vector<std::string>{"checkpoint", "journal.2", "journal.3"}));
    std::vector<std::string> want = {Str(Ns(1)), Str(Ns(2))};
    for (uint64_t n : live) want.push_back(Str(Put(n)));
    {
      // A crash now: a copy of the files as they are recovers everything.
      const std::string crashed = NewDir(absl::StrCat("crashed-", c.name));
      for (const auto& f : Files(d)) fs::copy_file(d + "/" + f, crashed + "/" + f);
      Recovered r;
      ASSERT_NE(Open(crashed, &r), nullptr);
      EXPECT_EQ(r.records, want);
      EXPECT_EQ(r.report.torn_tails, 0u);
    }
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, live); }).ok());
    EXPECT_EQ(Files(d), (std::vector<std::string>{"checkpoint", "journal.3"}));
    j.reset();
    Recovered r;
    ASSERT_NE(Open(d, &r), nullptr);
    EXPECT_EQ(r.records, want);
  }
}

// A read error during recovery is an error, never a torn tail: treating it as one would drop the
// committed records after it without a word.
TEST_F(JournalTest, ReadErrorDuringRecoveryFailsTheOpen) {
  {
    Recovered r;
    auto j = Open(dir_, &r);
    j->Append(Put(1));
    ASSERT_TRUE(j->Sync().ok());
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, {1}); }).ok());
    j->Append(Put(2));
    ASSERT_TRUE(j->Sync().ok());
  }
  for (const char* file : {"checkpoint", "journal.2"}) {
    SCOPED_TRACE(file);
    FaultFileSystem faulty;
    faulty.Inject(FaultFileSystem::Fail(Op::kRead, EIO).On(file));
    Recovered r;
    const auto j = Journal::Open(dir_, r.visitor(), &r.report, &faulty);
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInternal) << j.status();
    EXPECT_NE(j.status().message().find(absl::StrCat("read ", dir_, "/", file)), std::string::npos)
        << j.status();
    EXPECT_EQ(faulty.failures(), 1);
  }
  Recovered r;
  ASSERT_NE(Open(dir_, &r), nullptr) << "the files are intact";
  EXPECT_EQ(r.records.back(), Str(Put(2)));
}

// A checkpoint that cannot be looked at (stat fails other than ENOENT) fails the start with that
// error, rather than counting as absent and failing on the journal files it made redundant.
TEST_F(JournalTest, CheckpointThatCannotBeStatedFailsTheOpenWithItsError) {
  {
    Recovered r;
    auto j = Open(dir_, &r);
    j->Append(Put(1));
    ASSERT_TRUE(j->Sync().ok());
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) { Snapshot(e, {1}); }).ok());
  }
  FaultFileSystem faulty;
  faulty.Inject(FaultFileSystem::Fail(Op::kStat, EACCES).On("/checkpoint"));
  Recovered r;
  const auto j = Journal::Open(dir_, r.visitor(), &r.report, &faulty);
  EXPECT_EQ(j.status().code(), absl::StatusCode::kInternal) << j.status();
  EXPECT_EQ(ErrnoOf(j.status()), EACCES) << j.status();
  EXPECT_NE(j.status().message().find("stat " + dir_ + "/checkpoint"), std::string::npos)
      << j.status();
}

// A checkpoint keeps each put's last use (format version 2); the journal does not (its puts are
// in order, and recovery counts them as used when stored).
TEST_F(JournalTest, ACheckpointKeepsEachBlocksLastUseAndTheJournalDoesNot) {
  {
    Recovered r;
    auto j = Open(dir_, &r);
    ASSERT_TRUE(j->Checkpoint([&](Journal::Emitter& e) {
                   e.Emit(Ns(1));
                   e.Emit(Ns(2));
                   for (uint64_t n : {0, 1, 2}) {
                     PutRecord put = Put(n);
                     put.last_use = 900 - n;
                     e.Emit(put);
                   }
                 }).ok());
    PutRecord later = Put(3);
    later.last_use = 5;
    j->Append(later);
    ASSERT_TRUE(j->Sync().ok());
  }
  std::vector<std::pair<uint64_t, uint64_t>> uses;  // (slot, last_use)
  RecoveryVisitor v;
  v.on_put = [&](const PutRecord& r) { uses.emplace_back(r.slot, r.last_use); };
  ASSERT_TRUE(Journal::Open(dir_, v, nullptr).ok());
  EXPECT_EQ(uses, (std::vector<std::pair<uint64_t, uint64_t>>{
                      {100, 900}, {101, 899}, {102, 898}, {103, 0}}));
}

// One framed record, as JOURNAL.md describes it.
std::string Framed(uint32_t type, const std::string& payload) {
  std::string out;
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  };
  u32(static_cast<uint32_t>(payload.size()));
  u32(type);
  out += payload;
  const uint64_t sum = XXH3_64bits(out.data() + 4, 4 + payload.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(sum >> (8 * i)));
  return out;
}

std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

std::string Header(uint32_t version, uint32_t kind, uint64_t gen) {
  return Framed(1, "TUTTIJNL" + Le(version, 4) + Le(kind, 4) + Le(gen, 8));
}

// A checkpoint written before the last use was kept (format version 1: type 3 puts) is still read,
// its puts without a last use.
TEST_F(JournalTest, AVersion1CheckpointIsStillRead) {
  const PutRecord put = Put(7, 2);
  std::string payload = Le(put.ns, 8) + std::string(put.key.view()) + Le(put.slot, 8) +
                        Le(put.epoch, 8) + Le(put.object_len, 4) + Le(put.checksums.size(), 4);
  for (uint64_t c : put.checksums) payload += Le(c, 8);
  const std::string ns = Le(1, 8) + Ns(1).descriptor;
  {
    std::ofstream f(dir_ + "/checkpoint", std::ios::binary);
    f << Header(1, 1, 4) << Framed(2, ns) << Framed(3, payload) << Framed(5, Le(2, 8));
  }
  {
    std::ofstream f(dir_ + "/journal.4", std::ios::binary);
    f << Header(1, 0, 4);
  }
  uint64_t last_use = 1;
  RecoveryVisitor v;
  v.on_put = [&](const PutRecord& r) { last_use = r.last_use; };
  Recovered r;
  auto j = Journal::Open(dir_, r.visitor(), &r.report);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(r.records, (std::vector<std::string>{Str(Ns(1)), Str(put)}));
  EXPECT_EQ(r.report.generation, 5u);
  j->reset();
  ASSERT_TRUE(Journal::Open(dir_, v, nullptr).ok());
  EXPECT_EQ(last_use, 0u);
  // A version this tuttid does not know is refused.
  {
    std::ofstream f(dir_ + "/checkpoint", std::ios::binary);
    f << Header(3, 1, 5) << Framed(5, Le(0, 8));
  }
  EXPECT_EQ(Journal::Open(dir_, {}, nullptr).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tutti::store
