// tuttictl's operator commands against the real tuttid on a real pool file: verify finds and
// drops exactly the blocks corrupted on purpose in the file (one object, one slot header) and
// shows its progress; drain, config and log-level answer.
#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "daemon/pool/layout.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

// XORs the byte at `offset` of `path` with 0xff.
void FlipByte(const std::string& path, uint64_t offset) {
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  uint8_t b = 0;
  ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= 0xff;
  ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
}

TEST(OpsTest, VerifyDropsExactlyTheCorruptBlocksOfARealPool) {
  TuttidConfig config;  // one pool file, 4 KiB objects, 8 per block
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  auto layout = pool::PoolLayout::Compute(config.capacity_bytes, 1, config.object_bytes,
                                          config.max_objects);
  ASSERT_TRUE(layout.ok());
  const std::string ctl = RunfilePath("client/tuttictl");
  const std::string sock = "--socket=" + (*env)->socket();
  {
    auto daemon = TuttidProcess::Start(**env);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    CommandResult r = RunCommand({ctl, sock, "bench", "--phase=store", "--layers=4",
                                  "--kv_heads=1", "--head_dim=64", "--blocks=30", "--batch=10"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err << (*daemon)->LogTail();
    r = RunCommand({ctl, sock, "drain", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("\"drained\":true"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\"backlog_blocks_after\":0"), std::string::npos) << r.out;
    r = RunCommand({ctl, sock, "config"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find((*env)->pool_dir()), std::string::npos) << r.out;
    r = RunCommand({ctl, sock, "log-level", "store", "debug"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "store: info -> debug\n");
    ASSERT_EQ(*(*daemon)->Stop(), 0);
  }
  // Slots are handed out from 0 up: spoil slot 5's layer-1 V object and slot 9's header.
  const std::string pool = (*env)->pool_dir() + "/tutti.pool";
  FlipByte(pool, layout->ObjectLocation(5, 3).offset + 17);
  FlipByte(pool, layout->HeaderLocation(9).offset + 30);

  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  CommandResult r =
      RunCommand({ctl, sock, "verify", "--batch_blocks=4", "--progress=lines",
                  "--progress_every_ms=0"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("verify: 4/30 blocks (13.3%)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verify: 30/30 blocks (100.0%), 2 bad"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verified 30 blocks in"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("     5  object checksum mismatch"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("     9  slot header"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("2 bad blocks found and dropped from the index"), std::string::npos)
      << r.err;

  // Dropped: the others stay, and a second verify finds nothing.
  r = RunCommand({ctl, sock, "stats", "--json"});
  EXPECT_NE(r.out.find("\"blocks_ssd\":28"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"verify_errors\":2"), std::string::npos) << r.out;
  r = RunCommand({ctl, sock, "verify", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("{\"blocks_total\":28,\"blocks_checked\":28,\"blocks_bad\":0,"),
            std::string::npos)
      << r.out;
  // And across a restart (the Deletes were journaled).
  ASSERT_EQ(*(*daemon)->Stop(), 0);
  daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  r = RunCommand({ctl, sock, "stats", "--json"});
  EXPECT_NE(r.out.find("\"blocks_ssd\":28"), std::string::npos) << r.out;
}

// The operator frees a namespace's place: remove-namespace evicts its blocks and forgets it, for
// good (a restart does not bring it back); an unknown id is an error, a missing one a usage error.
TEST(OpsTest, RemoveNamespaceFreesItAcrossARestart) {
  TuttidConfig config;
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  const std::string ctl = RunfilePath("client/tuttictl");
  const std::string sock = "--socket=" + (*env)->socket();
  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  CommandResult r = RunCommand({ctl, sock, "bench", "--phase=store", "--layers=4", "--kv_heads=1",
                                "--head_dim=64", "--blocks=20", "--batch=10"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << (*daemon)->LogTail();
  ASSERT_EQ(RunCommand({ctl, sock, "drain"}).exit_code, 0);
  r = RunCommand({ctl, sock, "stats", "--json"});
  const std::string key = "\"namespace_id\":\"";
  const size_t at = r.out.find(key);
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string id =
      r.out.substr(at + key.size(), r.out.find('"', at + key.size()) - at - key.size());
  EXPECT_EQ(RunCommand({ctl, sock, "remove-namespace"}).exit_code, 2);
  r = RunCommand({ctl, sock, "remove-namespace", "0x1234"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("unknown namespace"), std::string::npos) << r.err;
  r = RunCommand({ctl, sock, "remove-namespace", id});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << (*daemon)->LogTail();
  EXPECT_EQ(r.out, "removed namespace " + id + ": 20 blocks evicted, 0 sessions closed\n");
  r = RunCommand({ctl, sock, "remove-namespace", id, "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  r = RunCommand({ctl, sock, "stats", "--json"});
  EXPECT_NE(r.out.find("\"namespaces\":[]"), std::string::npos) << r.out;
  ASSERT_EQ(*(*daemon)->Stop(), 0);
  daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  r = RunCommand({ctl, sock, "stats", "--json"});
  EXPECT_NE(r.out.find("\"namespaces\":[]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"slots_used\":0"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tutti::testing
