// tuttictl's commands against the in-process fake daemon: output forms, exit codes, usage errors.
#include <stdlib.h>
#include <unistd.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/tuttictl/command.h"
#include "gtest/gtest.h"
#include "tests/common/fake_tuttid.h"

namespace tutti::tuttictl {
namespace {

struct CtlRun {
  int code;
  std::string out, err;
};

CtlRun Tuttictl(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int code = RunTuttictl(args, out, err);
  return {code, out.str(), err.str()};
}

class TuttictlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A fresh directory: pids repeat across Bazel's sandboxes, so they cannot name the socket.
    char dir[] = "/tmp/tutti-ctl-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/s.sock";
    auto fake = testing::FakeTuttid::Start(socket_);
    ASSERT_TRUE(fake.ok()) << fake.status();
    fake_ = std::move(*fake);
  }
  void TearDown() override {
    fake_.reset();
    unlink(socket_.c_str());
    rmdir(dir_.c_str());
  }
  // A small layout so the bench runs in milliseconds.
  std::vector<std::string> Bench(std::vector<std::string> extra) {
    std::vector<std::string> args = {"--socket",     socket_,         "bench",       "--layers=2",
                                     "--kv_heads=1", "--head_dim=64", "--blocks=20", "--batch=8"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::string dir_, socket_;
  std::unique_ptr<testing::FakeTuttid> fake_;
};

TEST_F(TuttictlTest, Status) {
  const CtlRun r = Tuttictl({"status", "--socket=" + socket_});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("io backend   memory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("up 1h02m03s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("capacity     1.0 GiB in 512 slots"), std::string::npos) << r.out;
  const CtlRun j = Tuttictl({"--json", "--socket", socket_, "status"});
  EXPECT_EQ(j.code, 0);
  EXPECT_NE(j.out.find("\"capacity_bytes\":1073741824"), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"pool_dirs\":[\"/fake/pool\"]"), std::string::npos) << j.out;
}

// Every figure of the stats registry, as /metrics names it (the fake reports one).
TEST_F(TuttictlTest, StatsShowsTheRegistrysFigures) {
  const CtlRun human = Tuttictl({"stats", "--metrics", "--socket", socket_});
  EXPECT_EQ(human.code, 0) << human.err;
  const size_t row = human.out.find("tutti_errors_total{kind=\"verify\"} ");
  ASSERT_NE(row, std::string::npos) << human.out;
  EXPECT_EQ(human.out.substr(human.out.find('\n', row) - 2, 3), " 4\n") << human.out;
  EXPECT_EQ(Tuttictl({"stats", "--socket", socket_}).out.find("tutti_errors_total"),
            std::string::npos);
  const CtlRun json = Tuttictl({"stats", "--json", "--socket", socket_});
  EXPECT_NE(json.out.find("\"metrics\":[{\"name\":\"tutti_errors_total\",\"type\":\"counter\","
                          "\"unit\":\"\",\"label_names\":[\"kind\"],\"samples\":[{\"labels\":"
                          "{\"kind\":\"verify\"},\"value\":4}]}]"),
            std::string::npos)
      << json.out;
}

TEST_F(TuttictlTest, BenchVerifiesAndStatsCount) {
  const CtlRun r = Tuttictl(Bench({"--verify"}));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("hits 20, misses 0, failed 0, mismatches 0 blocks"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("durable 20"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lookup latency  p50"), std::string::npos) << r.out;
  EXPECT_EQ(fake_->blocks(), 20u);
  EXPECT_EQ(fake_->sessions(), 0u);  // detached

  const CtlRun stats = Tuttictl({"stats", "--json", "--socket", socket_});
  EXPECT_EQ(stats.code, 0);
  EXPECT_NE(stats.out.find("\"blocks_stored\":20"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("\"namespace_id\":\"0xabcdef0123456789\""), std::string::npos);
  // Each namespace row carries its share of the hits (as tutti_namespace_* metrics do).
  const std::string rows = stats.out.substr(std::min(stats.out.find("\"namespaces\""),
                                                     stats.out.size()));
  for (const char* key : {"\"lookup_hits\":", "\"lookup_misses\":", "\"blocks_retrieved\":",
                          "\"dram_hits\":", "\"owner_uid\":", "\"sessions\":"}) {
    EXPECT_NE(rows.find(key), std::string::npos) << key << " in " << rows;
  }
  EXPECT_NE(stats.out.find("\"decisions\":0,\"prediction_errors\":0,\"prediction_error_mean\":"),
            std::string::npos)
      << stats.out;
  const CtlRun human = Tuttictl({"stats", "--socket", socket_});
  EXPECT_NE(human.out.find("0xabcdef0123456789  bench-llama3-8b"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("0 (no measured TTFT reported)"), std::string::npos) << human.out;
  // The write backlog (the fake reports 3 blocks of 2 MiB, 250 ms, 2 refused).
  EXPECT_NE(stats.out.find("\"write_backlog_bytes\":6291456,\"write_backlog_blocks\":3,"
                           "\"write_backlog_age_ms\":250"),
            std::string::npos)
      << stats.out;
  EXPECT_NE(stats.out.find("\"store_rejected_backlog\":2"), std::string::npos) << stats.out;
  EXPECT_NE(human.out.find("write backlog  3 blocks, 6.0 MiB, oldest waiting 250 ms"),
            std::string::npos)
      << human.out;
  EXPECT_NE(human.out.find("(of them for the write backlog 2)"), std::string::npos) << human.out;
  // Admission (the fake reports second_sight, 5 admitted, 7 declined).
  EXPECT_NE(stats.out.find("\"blocks_admitted\":5,\"blocks_declined\":7"), std::string::npos)
      << stats.out;
  EXPECT_NE(stats.out.find("\"admission\":\"second_sight\""), std::string::npos) << stats.out;
  EXPECT_NE(human.out.find("admission      second_sight: 5 blocks admitted, 7 declined"),
            std::string::npos)
      << human.out;

  // A retrieve-only run with the same seed finds everything; another seed misses everything.
  const CtlRun again = Tuttictl(Bench({"--phase=retrieve", "--verify", "--json"}));
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("\"hits\":20,\"misses\":0"), std::string::npos) << again.out;
  EXPECT_NE(again.out.find("\"ok\":true"), std::string::npos);
  const CtlRun other = Tuttictl(Bench({"--phase=retrieve", "--verify", "--seed=2"}));
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.err.find("verify failed: 20 misses"), std::string::npos) << other.err;
}

TEST_F(TuttictlTest, BenchFailsOnCorruption) {
  ASSERT_EQ(Tuttictl(Bench({"--phase=store"})).code, 0);
  fake_->CorruptNextRetrieve();
  const CtlRun r = Tuttictl(Bench({"--phase=retrieve", "--verify"}));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("1 mismatched blocks (1 bytes)"), std::string::npos) << r.err;
  // Without --verify the same corruption is not looked for, and the run succeeds.
  fake_->CorruptNextRetrieve();
  EXPECT_EQ(Tuttictl(Bench({"--phase=retrieve"})).code, 0);
}

TEST_F(TuttictlTest, SessionsAndEvict) {
  CtlRun r = Tuttictl({"sessions", "--socket", socket_});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "no sessions\n");
  ASSERT_EQ(Tuttictl(Bench({"--phase=store"})).code, 0);
  r = Tuttictl({"evict", "--socket", socket_, "--namespace", "bench-llama3-8b"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "evicted 20 blocks; 0 pinned blocks kept\n");
  r = Tuttictl({"evict", "--socket", socket_, "--namespace", "0xabcdef0123456789", "--json"});
  EXPECT_EQ(r.out, "{\"evicted\":0,\"skipped_pinned\":0}\n");
  r = Tuttictl({"evict", "--socket", socket_, "--namespace", "no-such-model"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no namespace has model id 'no-such-model'"), std::string::npos);
  r = Tuttictl({"evict", "--socket", socket_, "--namespace", "0x1234"});
  EXPECT_EQ(r.code, 1);  // the daemon's NOT_FOUND
  EXPECT_NE(r.err.find("tuttid: no such namespace"), std::string::npos) << r.err;
  EXPECT_EQ(Tuttictl({"evict", "--socket", socket_, "--all"}).code, 0);
}

TEST_F(TuttictlTest, VerifyShowsProgressAndTheBlocksItDropped) {
  ASSERT_EQ(Tuttictl(Bench({"--phase=store"})).code, 0);
  CtlRun r = Tuttictl({"verify", "--socket", socket_, "--batch_blocks=8", "--progress=lines"});
  EXPECT_EQ(r.code, 0) << r.err;
  // 20 blocks in batches of 8, 0.5 s a batch (the fake's clock): the ETA follows the rate.
  EXPECT_NE(r.out.find("verify: 8/20 blocks (40.0%), 0 bad, 16.0 MiB read, 32.0 MiB/s, ETA 750ms\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("verify: 20/20 blocks (100.0%)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verified 20 blocks in 1.2s: 0 bad"), std::string::npos) << r.out;

  fake_->CorruptOneBlockForVerify();
  r = Tuttictl({"verify", "--socket", socket_, "--progress=bar"});
  EXPECT_EQ(r.code, 1) << "bad blocks make verify fail";
  EXPECT_NE(r.out.find("\r[############..................] 8/20 blocks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("object checksum mismatch"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("1 bad blocks found and dropped from the index"), std::string::npos) << r.err;
  EXPECT_EQ(fake_->blocks(), 19u);

  r = Tuttictl({"verify", "--socket", socket_, "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("verify:"), std::string::npos) << "no progress lines with --json";
  EXPECT_NE(r.out.find("{\"blocks_total\":19,\"blocks_checked\":19,\"blocks_bad\":0,"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(Tuttictl({"verify", "--progress=fancy"}).code, 2);
}

TEST_F(TuttictlTest, DrainPrintsTheBacklogAndFailsOnTimeout) {
  CtlRun r = Tuttictl({"drain", "--socket", socket_});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("backlog before  3 blocks (6.0 MiB)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("backlog after   0 blocks (0 B)"), std::string::npos) << r.out;
  r = Tuttictl({"drain", "--socket", socket_, "--wait_ms=10", "--json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("\"drained\":false"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("did not empty within 10 ms (--wait_ms); 1 blocks not yet durable"),
            std::string::npos)
      << r.err;
}

TEST_F(TuttictlTest, ConfigAndLogLevel) {
  CtlRun r = Tuttictl({"config", "--socket", socket_});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "pool {\n  dirs: \"/fake/pool\"\n}\nlog_level: \"info\"\n");
  r = Tuttictl({"config", "--socket", socket_, "--json"});
  EXPECT_NE(r.out.find("{\"config\":\"pool {\\n"), std::string::npos) << r.out;
  r = Tuttictl({"log-level", "--socket", socket_, "store", "debug"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "store: info -> debug\n");
  r = Tuttictl({"log-level", "--socket", socket_, "nope", "debug"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("tuttid: no logger named 'nope'"), std::string::npos) << r.err;
  EXPECT_EQ(Tuttictl({"log-level", "store"}).code, 2);
}

TEST_F(TuttictlTest, DevicesSaysWhatThePoolIsOn) {
  // The fake's pool dir does not exist: reported per directory, and the command fails.
  CtlRun r = Tuttictl({"devices", "--socket", socket_});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/fake/pool\n  error: stat /fake/pool: No such file or directory"),
            std::string::npos)
      << r.out;
  // A real directory (this machine's disk, NVMe or not), without a daemon.
  r = Tuttictl({"devices", "--dirs", dir_, "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("{\"dirs\":[{\"dir\":\"" + dir_ + "\",\"device\":"), std::string::npos)
      << r.out;
}

TEST_F(TuttictlTest, UsageErrorsExit2) {
  EXPECT_EQ(Tuttictl({}).code, 2);
  EXPECT_EQ(Tuttictl({"frobnicate"}).code, 2);
  EXPECT_EQ(Tuttictl({"status", "--bogus"}).code, 2);
  EXPECT_EQ(Tuttictl({"status", "extra"}).code, 2);
  EXPECT_EQ(Tuttictl({"evict"}).code, 2);
  EXPECT_EQ(Tuttictl({"evict", "--all", "--namespace=3"}).code, 2);
  EXPECT_EQ(Tuttictl({"remove-namespace"}).code, 2);
  EXPECT_EQ(Tuttictl({"remove-namespace", "0x0"}).code, 2);
  EXPECT_EQ(Tuttictl({"remove-namespace", "llama"}).code, 2);
  EXPECT_EQ(Tuttictl({"bench", "--phase=sideways"}).code, 2);
  EXPECT_EQ(Tuttictl({"bench", "--blocks=0"}).code, 2);
  EXPECT_EQ(Tuttictl({"bench", "--layers=0"}).code, 2);
  EXPECT_EQ(Tuttictl({"status", "--blocks=3"}).code, 2);  // a bench flag on another command
  EXPECT_EQ(Tuttictl({"end-session"}).code, 2);
  EXPECT_EQ(Tuttictl({"end-session", "0"}).code, 2);
  EXPECT_EQ(Tuttictl({"end-session", "x7"}).code, 2);
  EXPECT_EQ(Tuttictl({"end-session", "7", "8"}).code, 2);
  EXPECT_EQ(Tuttictl({"end-session", "7", "--all"}).code, 2);
  const CtlRun help = Tuttictl({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("bench"), std::string::npos);
  const CtlRun bench_help = Tuttictl({"bench", "--help"});
  EXPECT_EQ(bench_help.code, 0);
  EXPECT_NE(bench_help.out.find("--engine_blocks=<n>"), std::string::npos);
}

TEST(TuttictlUnreachableTest, SaysHowToCheck) {
  const CtlRun r = Tuttictl({"status", "--socket", "/tmp/tutti-nothing-here.sock"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("cannot reach tuttid at /tmp/tutti-nothing-here.sock.admin: No such file or "
                       "directory; is it running? (systemctl status tuttid)"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace tutti::tuttictl
