#include "daemon/io/uring_backend.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "common/stats.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/test_util.h"
#include "gtest/gtest.h"

namespace tutti::io {
namespace {

constexpr uint32_t kFiles = 2;
constexpr uint64_t kFileBytes = 8 << 20;
constexpr uint32_t kChunk = 64 << 10;

// Deterministic content for (file, offset, generation), one 8-byte word at a time.
void Fill(uint8_t* buf, uint32_t len, uint32_t file, uint64_t offset, uint64_t gen) {
  for (uint32_t i = 0; i < len; i += 8) {
    const uint64_t v = (gen << 56) ^ (uint64_t{file} << 48) ^ (offset + i) * 0x9E3779B97F4A7C15ull;
    std::memcpy(buf + i, &v, 8);
  }
}

bool Matches(const uint8_t* buf, uint32_t len, uint32_t file, uint64_t offset, uint64_t gen) {
  std::vector<uint8_t> want(len);
  Fill(want.data(), len, file, offset, gen);
  return std::memcmp(buf, want.data(), len) == 0;
}

class UringBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    dir_ = testing::MakeODirectDir("uring", &why);
    if (dir_.empty()) GTEST_SKIP() << "no O_DIRECT filesystem: " << why;
    for (uint32_t f = 0; f < kFiles; ++f) {
      paths_.push_back(dir_ + "/pool" + std::to_string(f));
      const int fd = open(paths_.back().c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
      ASSERT_GE(fd, 0) << std::strerror(errno);
      ASSERT_EQ(ftruncate(fd, kFileBytes), 0);
      fds_.push_back(fd);
    }
  }
  void TearDown() override {
    if (!dir_.empty()) testing::RemoveTree(dir_);
  }

  std::unique_ptr<UringBackend> Make(uint32_t depth = 8, uint32_t memory_read_workers = 4) {
    auto b = UringBackend::Create(fds_, UringOptions{depth, memory_read_workers});
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : nullptr;
  }

  // Writes generation `gen` to every chunk of every file, through buffers carved from `mem`.
  void WriteAll(IoBackend& b, uint8_t* mem, uint64_t gen) {
    std::vector<IoRequest> batch;
    uint64_t at = 0;
    for (uint32_t f = 0; f < kFiles; ++f) {
      for (uint64_t off = 0; off < kFileBytes; off += kChunk, at += kChunk) {
        Fill(mem + at, kChunk, f, off, gen);
        batch.push_back({Op::kWrite, f, off, mem + at, kChunk});
      }
    }
    b.Execute(absl::MakeSpan(batch));
    for (const IoRequest& r : batch) ASSERT_EQ(r.result, kChunk);
  }

  void ExpectAll(IoBackend& b, uint8_t* mem, uint64_t gen) {
    std::memset(mem, 0, kFiles * kFileBytes);
    std::vector<IoRequest> batch;
    uint64_t at = 0;
    for (uint32_t f = 0; f < kFiles; ++f) {
      for (uint64_t off = 0; off < kFileBytes; off += kChunk, at += kChunk) {
        batch.push_back({Op::kRead, f, off, mem + at, kChunk});
      }
    }
    b.Execute(absl::MakeSpan(batch));
    for (const IoRequest& r : batch) {
      ASSERT_EQ(r.result, kChunk);
      ASSERT_TRUE(Matches(static_cast<uint8_t*>(r.buf), kChunk, r.file, r.offset, gen))
          << "file " << r.file << " offset " << r.offset;
    }
  }

  std::string dir_;
  std::vector<std::string> paths_;
  std::vector<int> fds_;
};

TEST_F(UringBackendTest, WritesThenReadsBackWithPlainBuffers) {
  auto b = Make();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->name(), "uring");
  EXPECT_EQ(b->num_files(), kFiles);
  EXPECT_EQ(b->file_size(1), kFileBytes);
  AlignedBuffer mem(kFiles * kFileBytes);
  WriteAll(*b, mem.data(), 1);
  ExpectAll(*b, mem.data(), 1);
  EXPECT_TRUE(b->Sync(0).ok());
  EXPECT_TRUE(b->Sync(1).ok());
  EXPECT_EQ(b->Sync(2).code(), absl::StatusCode::kInvalidArgument);
  const UringCounters c = b->counters();
  EXPECT_EQ(c.fixed_buffer_ops, 0u);
  EXPECT_EQ(c.plain_buffer_ops, 2 * kFiles * kFileBytes / kChunk);
}

// The backend's counters reach the stats registry (so /metrics and Admin.Stats) as its families,
// read at each collection.
TEST_F(UringBackendTest, CountersReachTheStatsRegistry) {
  auto b = Make();
  ASSERT_NE(b, nullptr);
  stats::Registry registry;
  b->RegisterStats(&registry);
  auto value = [&](const std::string& name, const std::string& label) {
    for (const stats::Family& f : registry.Collect()) {
      if (f.spec.name != name) continue;
      for (const stats::Sample& s : f.samples) {
        if (label.empty() ? s.labels.empty() : s.labels == std::vector<std::string>{label}) {
          return s.value;
        }
      }
    }
    ADD_FAILURE() << name << " {" << label << "} not collected";
    return -1.0;
  };
  EXPECT_EQ(value("tutti_io_uring_ops_total", "plain"), 0);
  AlignedBuffer mem(kFiles * kFileBytes);
  WriteAll(*b, mem.data(), 1);
  ExpectAll(*b, mem.data(), 1);
  const UringCounters c = b->counters();
  EXPECT_EQ(value("tutti_io_uring_ops_total", "plain"), 2 * kFiles * kFileBytes / kChunk);
  EXPECT_EQ(value("tutti_io_uring_ops_total", "fixed"), 0);
  EXPECT_EQ(value("tutti_io_uring_enter_calls_total", ""), c.enter_calls);
  EXPECT_GT(c.enter_calls, 0u);
  EXPECT_EQ(value("tutti_io_uring_in_flight_at_enter_total", ""), c.in_flight_sum);
  EXPECT_EQ(value("tutti_io_uring_short_retries_total", ""), c.short_retries);
  EXPECT_EQ(value("tutti_io_uring_memory_reads_in_flight_max", ""), c.max_memory_reads_in_flight);
  EXPECT_EQ(value("tutti_io_uring_memory_read_rings", ""), c.memory_read_rings);
}

// On tmpfs, reads go to up to memory_read_workers io_uring workers per file and still land whole;
// elsewhere the option changes nothing.
TEST_F(UringBackendTest, TmpfsReadsUseWorkersOnlyOnTmpfs) {
  struct statfs fs;
  ASSERT_EQ(statfs(dir_.c_str(), &fs), 0) << std::strerror(errno);
  const bool tmpfs = fs.f_type == TMPFS_MAGIC;
  AlignedBuffer mem(kFiles * kFileBytes);
  for (uint32_t workers : {4u, 1u}) {
    if (workers == 1) {  // the first backend closed the files
      for (uint32_t f = 0; f < kFiles; ++f) {
        fds_[f] = open(paths_[f].c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
        ASSERT_GE(fds_[f], 0) << std::strerror(errno);
      }
    }
    auto b = Make(8, workers);
    ASSERT_NE(b, nullptr);
    WriteAll(*b, mem.data(), workers);
    ExpectAll(*b, mem.data(), workers);
    EXPECT_EQ(b->counters().memory_files, tmpfs && workers > 1 ? kFiles : 0u)
        << dir_ << " tmpfs " << tmpfs << " workers " << workers;
    EXPECT_EQ(b->counters().memory_read_rings, tmpfs && workers > 1 ? kFiles : 0u);
  }
  for (uint32_t bad : {0u, 65u}) {
    auto b = UringBackend::Create({}, UringOptions{8, bad});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// One pool file on /dev/shm, where there is a tmpfs there that takes O_DIRECT.
class UringBackendShmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    struct statfs fs;
    if (statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
      GTEST_SKIP() << "no tmpfs /dev/shm";
    }
    ASSERT_NE(mkdtemp(dir_.data()), nullptr) << std::strerror(errno);
    fd_ = open((dir_ + "/pool0").c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd_ < 0) GTEST_SKIP() << "tmpfs without O_DIRECT: " << std::strerror(errno);
    ASSERT_EQ(ftruncate(fd_, kFileBytes), 0);
  }
  void TearDown() override {
    if (dir_.back() != 'X') testing::RemoveTree(dir_);
  }

  // Writes generation `gen` over the whole file through `mem` (kFileBytes), zeroes `mem`, reads
  // the file back into it in one batch and checks every read.
  static void WriteThenReadBack(IoBackend& b, uint8_t* mem, uint64_t gen) {
    std::vector<IoRequest> batch;
    for (uint64_t off = 0; off < kFileBytes; off += kChunk) {
      Fill(mem + off, kChunk, 0, off, gen);
      batch.push_back({Op::kWrite, 0, off, mem + off, kChunk});
    }
    b.Execute(absl::MakeSpan(batch));
    for (const IoRequest& r : batch) ASSERT_EQ(r.result, kChunk);
    std::memset(mem, 0, kFileBytes);
    for (IoRequest& r : batch) {
      r.op = Op::kRead;
      r.result = 0;
    }
    b.Execute(absl::MakeSpan(batch));
    for (const IoRequest& r : batch) {
      ASSERT_EQ(r.result, kChunk);
      ASSERT_TRUE(Matches(static_cast<uint8_t*>(r.buf), kChunk, 0, r.offset, gen)) << r.offset;
    }
  }

  std::string dir_ = "/dev/shm/tutti-uring-XXXXXX";
  int fd_ = -1;  // handed to the backend
};

// Every read comes back whole and right with several workers copying the file at once.
TEST_F(UringBackendShmTest, ParallelTmpfsReadsLandWhole) {
  auto b = UringBackend::Create({fd_}, UringOptions{32, 3});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->counters().memory_files, 1u);
  AlignedBuffer mem(kFileBytes);
  WriteThenReadBack(**b, mem.data(), 7);
  // 128 reads queued at once with room for 32 in the ring: three at a time.
  EXPECT_EQ((*b)->counters().max_memory_reads_in_flight, 3u);
}

// Reads of a tmpfs file spread over several rings (io.memory_read_rings): each ring issues some,
// the file's reads in flight stay within memory_read_workers shared out between the rings, and
// every read comes back whole and right, in batches of reads alone and mixed with writes.
TEST_F(UringBackendShmTest, ReadRingsShareATmpfsFilesReads) {
  auto b = UringBackend::Create({fd_}, UringOptions{32, 8, 4});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->counters().memory_files, 1u);
  EXPECT_EQ((*b)->counters().memory_read_rings, 0u);  // no read yet
  AlignedBuffer mem(2 * kFileBytes);
  const uint64_t half = kFileBytes / 2;
  WriteThenReadBack(**b, mem.data(), 3);
  UringCounters c = (*b)->counters();
  EXPECT_EQ(c.memory_read_rings, 4u);
  EXPECT_LE(c.max_memory_reads_in_flight, 2u);  // 8 workers over 4 rings
  EXPECT_GE(c.max_memory_reads_in_flight, 1u);
  // Reads of the first half and writes of the second, in one batch: all complete, the reads
  // see what was there, and the writes land (read back after).
  std::vector<IoRequest> mixed;
  for (uint64_t off = 0; off < kFileBytes; off += kChunk) {
    uint8_t* buf = mem.data() + kFileBytes + off;
    if (off < half) {
      std::memset(buf, 0, kChunk);
      mixed.push_back({Op::kRead, 0, off, buf, kChunk});
    } else {
      Fill(buf, kChunk, 0, off, 4);
      mixed.push_back({Op::kWrite, 0, off, buf, kChunk});
    }
  }
  (*b)->Execute(absl::MakeSpan(mixed));
  for (const IoRequest& r : mixed) {
    ASSERT_EQ(r.result, kChunk) << r.offset;
    if (r.op == Op::kRead) {
      ASSERT_TRUE(Matches(static_cast<uint8_t*>(r.buf), kChunk, 0, r.offset, 3)) << r.offset;
    }
  }
  ASSERT_TRUE((*b)->Sync(0).ok());
  std::vector<IoRequest> back;
  for (uint64_t off = half; off < kFileBytes; off += kChunk) {
    std::memset(mem.data() + off, 0, kChunk);
    back.push_back({Op::kRead, 0, off, mem.data() + off, kChunk});
  }
  (*b)->Execute(absl::MakeSpan(back));
  for (const IoRequest& r : back) {
    ASSERT_EQ(r.result, kChunk);
    ASSERT_TRUE(Matches(static_cast<uint8_t*>(r.buf), kChunk, 0, r.offset, 4)) << r.offset;
  }
  for (uint32_t bad : {0u, 17u}) {  // a file of its own each (a refused Create closes it)
    auto none = UringBackend::Create({dup(fd_)}, UringOptions{8, 8, bad});
    EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(none.status().message().find("io.memory_read_rings"), std::string::npos)
        << none.status();
  }
}

// Small: io_uring charges registered buffers to RLIMIT_MEMLOCK (often 8 MiB) once per ring unless
// the process has CAP_IPC_LOCK in the initial namespace (not so inside Bazel's sandbox), and every
// process of the same user shares that budget.
constexpr uint64_t kSpan = 256 << 10;  // per file
constexpr uint64_t kRegion = kFiles * kSpan;

// Reads and writes `rounds` x kSpan of each file through `region` (kSpan per file per round).
void RoundTripThrough(IoBackend& b, uint8_t* region, int rounds, uint64_t gen) {
  for (int round = 0; round < rounds; ++round) {
    for (Op op : {Op::kWrite, Op::kRead}) {
      std::vector<IoRequest> batch;
      for (uint32_t f = 0; f < kFiles; ++f) {
        for (uint64_t at = 0; at < kSpan; at += kChunk) {
          uint8_t* buf = region + f * kSpan + at;
          const uint64_t off = round * kSpan + at;
          if (op == Op::kWrite) {
            Fill(buf, kChunk, f, off, gen);
          } else {
            std::memset(buf, 0, kChunk);
          }
          batch.push_back({op, f, off, buf, kChunk});
        }
      }
      b.Execute(absl::MakeSpan(batch));
      for (const IoRequest& r : batch) {
        ASSERT_EQ(r.result, kChunk);
        ASSERT_TRUE(Matches(static_cast<uint8_t*>(r.buf), kChunk, r.file, r.offset, gen));
      }
    }
  }
}

// Registers `region`, retrying a while: parallel tests of the same user may hold the memlock
// budget.
absl::Status RegisterWithRetry(IoBackend& b, absl::Span<uint8_t> region) {
  absl::Status s;
  for (int attempt = 0; attempt < 50; ++attempt) {
    s = b.RegisterBuffer(region);
    if (s.code() != absl::StatusCode::kResourceExhausted) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return s;
}

TEST_F(UringBackendTest, RegisteredBufferUsesFixedOps) {
  auto b = Make();
  ASSERT_NE(b, nullptr);
  AlignedBuffer staging(kRegion + kChunk);  // only the first kRegion bytes are registered
  const absl::Status reg = RegisterWithRetry(*b, staging.span().subspan(0, kRegion));
  ASSERT_TRUE(reg.ok()) << reg;
  EXPECT_EQ(b->RegisterBuffer(staging.span()).code(), absl::StatusCode::kFailedPrecondition);
  RoundTripThrough(*b, staging.data(), 3, 2);
  const uint64_t ops = 2 * 3 * kRegion / kChunk;
  EXPECT_EQ(b->counters().fixed_buffer_ops, ops);
  EXPECT_EQ(b->counters().plain_buffer_ops, 0u);

  // Buffers outside the registered region, or running past its end, still work (plain reads).
  AlignedBuffer other(kChunk);
  std::vector<IoRequest> batch = {
      {Op::kRead, 1, kChunk, other.data(), kChunk},
      {Op::kRead, 0, 0, staging.data() + kRegion - 4096, 8192},
  };
  b->Execute(absl::MakeSpan(batch));
  EXPECT_EQ(batch[0].result, kChunk);
  EXPECT_TRUE(Matches(other.data(), kChunk, 1, kChunk, 2));
  EXPECT_EQ(batch[1].result, 8192);
  EXPECT_TRUE(Matches(staging.data() + kRegion - 4096, 8192, 0, 0, 2));
  EXPECT_EQ(b->counters().fixed_buffer_ops, ops);
  EXPECT_EQ(b->counters().plain_buffer_ops, 2u);
}

TEST_F(UringBackendTest, FailedRegistrationLeavesTheBackendUsable) {
  auto b = Make();
  ASSERT_NE(b, nullptr);
  AlignedBuffer staging(kRegion);
  absl::Status reg;
  {
    struct rlimit old;
    ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &old), 0);
    absl::Cleanup restore = [&] { setrlimit(RLIMIT_MEMLOCK, &old); };
    struct rlimit none = old;
    none.rlim_cur = 0;
    ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &none), 0);
    reg = b->RegisterBuffer(staging.span());
  }
  // With CAP_IPC_LOCK in the initial namespace the kernel ignores the limit; both outcomes are
  // fine.
  if (!reg.ok()) {
    EXPECT_EQ(reg.code(), absl::StatusCode::kResourceExhausted) << reg;
  }
  RoundTripThrough(*b, staging.data(), 1, 6);
  if (reg.ok()) return;
  EXPECT_EQ(b->counters().fixed_buffer_ops, 0u);
  // Nothing stayed registered, so a later call may try again, and then the fixed path is used.
  const absl::Status again = RegisterWithRetry(*b, staging.span());
  ASSERT_TRUE(again.ok()) << again;
  RoundTripThrough(*b, staging.data(), 1, 7);
  EXPECT_EQ(b->counters().fixed_buffer_ops, 2 * kRegion / kChunk);
}

TEST_F(UringBackendTest, MixedBatchCompletes) {
  auto b = Make(4);
  ASSERT_NE(b, nullptr);
  AlignedBuffer mem(kFiles * kFileBytes);
  WriteAll(*b, mem.data(), 3);
  // One batch: read the first half of each file (gen 3) and write the second half (gen 4).
  AlignedBuffer work(kFiles * kFileBytes);
  std::vector<IoRequest> batch;
  uint64_t at = 0;
  for (uint64_t off = 0; off < kFileBytes; off += kChunk, at += kChunk) {
    for (uint32_t f = 0; f < kFiles; ++f) {
      const uint64_t pos = at * kFiles + f * kChunk;
      if (off < kFileBytes / 2) {
        batch.push_back({Op::kRead, f, off, work.data() + pos, kChunk});
      } else {
        Fill(work.data() + pos, kChunk, f, off, 4);
        batch.push_back({Op::kWrite, f, off, work.data() + pos, kChunk});
      }
    }
  }
  b->Execute(absl::MakeSpan(batch));
  for (const IoRequest& r : batch) {
    ASSERT_EQ(r.result, kChunk);
    const uint64_t gen = r.op == Op::kRead ? 3 : 4;
    EXPECT_TRUE(Matches(static_cast<uint8_t*>(r.buf), kChunk, r.file, r.offset, gen));
  }
  for (IoRequest& r : batch) r.op = Op::kRead;
  b->Execute(absl::MakeSpan(batch));
  for (const IoRequest& r : batch) {
    ASSERT_EQ(r.result, kChunk);
    const uint64_t gen = r.offset < kFileBytes / 2 ? 3 : 4;
    EXPECT_TRUE(Matches(static_cast<uint8_t*>(r.buf), kChunk, r.file, r.offset, gen));
  }
}

TEST_F(UringBackendTest, ManyConcurrentBatchesFromSeveralThreads) {
  auto b = Make(16);
  ASSERT_NE(b, nullptr);
  constexpr int kThreads = 4;
  constexpr int kBatches = 16;       // per thread, all in flight at once
  constexpr uint32_t kPerBatch = 8;  // requests, alternating files
  constexpr uint32_t kLen = 16 << 10;
  static_assert(uint64_t{kThreads} * kBatches * kPerBatch / kFiles * kLen <= kFileBytes);
  AlignedBuffer mem(uint64_t{kThreads} * kBatches * kPerBatch * kLen);
  std::atomic<int> done_calls{0};
  std::atomic<int> failures{0};
  auto worker = [&](int t, Op op) {
    std::vector<std::vector<IoRequest>> batches(kBatches);
    std::atomic<int> outstanding{kBatches};
    absl::Notification all_done;
    for (int i = 0; i < kBatches; ++i) {
      for (uint32_t j = 0; j < kPerBatch; ++j) {
        const uint64_t n = (static_cast<uint64_t>(t) * kBatches + i) * kPerBatch + j;  // global request number
        const uint32_t f = j % kFiles;
        const uint64_t off = n / kFiles * kLen;
        uint8_t* buf = mem.data() + n * kLen;
        if (op == Op::kWrite) Fill(buf, kLen, f, off, 5);
        batches[i].push_back({op, f, off, buf, kLen});
      }
      b->Submit(absl::MakeSpan(batches[i]), [&] {
        done_calls.fetch_add(1);
        if (outstanding.fetch_sub(1) == 1) all_done.Notify();
      });
    }
    all_done.WaitForNotification();
    for (const auto& batch : batches) {
      for (const IoRequest& r : batch) {
        if (r.result != kLen) failures.fetch_add(1);
        if (op == Op::kRead && !Matches(static_cast<uint8_t*>(r.buf), kLen, r.file, r.offset, 5)) {
          failures.fetch_add(1);
        }
      }
    }
  };
  for (Op op : {Op::kWrite, Op::kRead}) {
    if (op == Op::kRead) std::memset(mem.data(), 0, mem.size());
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t, op);
    for (auto& th : threads) th.join();
  }
  EXPECT_EQ(done_calls.load(), 2 * kThreads * kBatches);
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(UringBackendTest, RequestsOfAFileAreIssuedInArrivalOrder) {
  auto b = Make(/*depth=*/1);  // one request at a time: the issue order is the completion order
  ASSERT_NE(b, nullptr);
  AlignedBuffer mem(3 * kChunk);
  Fill(mem.data(), kChunk, 0, 0, 8);
  IoRequest first{Op::kWrite, 0, 0, mem.data(), kChunk};
  b->Execute(absl::MakeSpan(&first, 1));
  ASSERT_EQ(first.result, kChunk);
  // Write generation 9 and read the same range, the write listed first: the read sees 9.
  Fill(mem.data() + kChunk, kChunk, 0, 0, 9);
  std::vector<IoRequest> batch = {{Op::kWrite, 0, 0, mem.data() + kChunk, kChunk},
                                  {Op::kRead, 0, 0, mem.data() + 2 * kChunk, kChunk}};
  b->Execute(absl::MakeSpan(batch));
  ASSERT_EQ(batch[0].result, kChunk);
  ASSERT_EQ(batch[1].result, kChunk);
  EXPECT_TRUE(Matches(mem.data() + 2 * kChunk, kChunk, 0, 0, 9))
      << "the read went before the write";
  // And the other way round: a read listed before a write sees what was there before it.
  Fill(mem.data() + kChunk, kChunk, 0, 0, 10);
  batch = {{Op::kRead, 0, 0, mem.data() + 2 * kChunk, kChunk},
           {Op::kWrite, 0, 0, mem.data() + kChunk, kChunk}};
  b->Execute(absl::MakeSpan(batch));
  ASSERT_EQ(batch[0].result, kChunk);
  ASSERT_EQ(batch[1].result, kChunk);
  EXPECT_TRUE(Matches(mem.data() + 2 * kChunk, kChunk, 0, 0, 9)) << "the read went after the write";
}

TEST_F(UringBackendTest, InvalidRequestsCompleteWithEinval) {
  auto b = Make();
  ASSERT_NE(b, nullptr);
  AlignedBuffer mem(4 * kChunk);
  uint8_t* p = mem.data();
  std::vector<IoRequest> batch = {
      {Op::kRead, 0, 0, p, kChunk},                              // valid
      {Op::kRead, 0, 512, p, kChunk},                            // unaligned offset
      {Op::kRead, 0, 0, p, 1000},                                // unaligned length
      {Op::kRead, 0, 0, p + 8, kChunk},                          // unaligned buffer
      {Op::kRead, 0, 0, p, 0},                                   // empty
      {Op::kRead, 0, kFileBytes - 4096, p, 8192},                // runs past the end
      {Op::kWrite, 0, kFileBytes, p, 4096},                      // starts at the end
      {Op::kRead, kFiles, 0, p, 4096},                           // no such file
      {Op::kWrite, 1, 0, nullptr, 4096},                         // no buffer
      {Op::kWrite, 1, kFileBytes - kChunk, p + kChunk, kChunk},  // valid
  };
  b->Execute(absl::MakeSpan(batch));
  EXPECT_EQ(batch.front().result, kChunk);
  EXPECT_EQ(batch.back().result, kChunk);
  for (size_t i = 1; i + 1 < batch.size(); ++i) EXPECT_EQ(batch[i].result, -EINVAL) << i;
}

TEST_F(UringBackendTest, DoneRunsOnABackendThreadEvenWithNothingToDo) {
  auto b = Make();
  ASSERT_NE(b, nullptr);
  AlignedBuffer mem(kChunk);
  for (int invalid = 0; invalid < 2; ++invalid) {
    std::vector<IoRequest> batch;
    if (invalid) batch.push_back({Op::kRead, 7, 0, mem.data(), kChunk});
    absl::Notification n;
    std::thread::id ran_on;
    b->Submit(absl::MakeSpan(batch), [&] {
      ran_on = std::this_thread::get_id();
      n.Notify();
    });
    n.WaitForNotification();
    EXPECT_NE(ran_on, std::this_thread::get_id());
    if (invalid) {
      EXPECT_EQ(batch[0].result, -EINVAL);
    }
  }
}

TEST_F(UringBackendTest, ShortReadReportsBytesMoved) {
  auto b = Make();
  ASSERT_NE(b, nullptr);
  // Shrink file 0 behind the backend's back: a read across the new end is short.
  const int other = open(paths_[0].c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(other, 0);
  ASSERT_EQ(ftruncate(other, 4 * kChunk + 8192), 0);
  close(other);
  AlignedBuffer mem(kChunk);
  IoRequest r{Op::kRead, 0, 4 * kChunk, mem.data(), kChunk};
  b->Execute(absl::MakeSpan(&r, 1));
  EXPECT_EQ(r.result, 8192);
  EXPECT_EQ(b->counters().short_retries, 1u);
}

TEST_F(UringBackendTest, DestructorCompletesQueuedBatches) {
  auto b = Make(2);
  ASSERT_NE(b, nullptr);
  AlignedBuffer mem(64 * kChunk);
  std::vector<std::vector<IoRequest>> batches(32);
  std::atomic<int> done_calls{0};
  for (int i = 0; i < 32; ++i) {
    for (uint32_t f = 0; f < kFiles; ++f) {
      batches[i].push_back(
          {Op::kWrite, f, uint64_t(i) * kChunk, mem.data() + (2 * i + f) * kChunk, kChunk});
    }
    b->Submit(absl::MakeSpan(batches[i]), [&] { done_calls.fetch_add(1); });
  }
  b.reset();
  EXPECT_EQ(done_calls.load(), 32);
  for (const auto& batch : batches) {
    for (const IoRequest& r : batch) EXPECT_EQ(r.result, kChunk);
  }
  fds_.clear();  // closed by the backend
}

TEST_F(UringBackendTest, CreateRejectsBadArgumentsAndClosesFds) {
  EXPECT_EQ(UringBackend::Create({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  auto b = UringBackend::Create(fds_, UringOptions{0});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  for (int fd : fds_) EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "fd " << fd << " left open";
  int p[2];  // a pipe is neither a regular file nor a block device
  ASSERT_EQ(pipe(p), 0);
  b = UringBackend::Create({p[0]}, {});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  close(p[1]);
  fds_.clear();
}

}  // namespace
}  // namespace tutti::io
