// tuttictl's operator commands against the real tuttid on a real pool file: verify finds and
// drops exactly the blocks corrupted on purpose in the file (one object, one slot header) and
// shows its progress; drain, config and log-level answer. A pin hog leaves room for Stores, and
// the operator evicts around it and ends its leases.
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
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
  auto layout =
      pool::PoolLayout::Compute(config.capacity_bytes, 1, config.object_bytes, config.max_objects);
  ASSERT_TRUE(layout.ok());
  const std::string ctl = RunfilePath("client/tuttictl");
  const std::string sock = "--socket=" + (*env)->socket();
  {
    auto daemon = TuttidProcess::Start(**env);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    CommandResult r = RunCommand({ctl, sock, "bench", "--phase=store", "--layers=4", "--kv_heads=1",
                                  "--head_dim=64", "--blocks=30", "--batch=10"});
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
  CommandResult r = RunCommand(
      {ctl, sock, "verify", "--batch_blocks=4", "--progress=lines", "--progress_every_ms=0"});
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

// Issue 19: one session's Lookups pinned the whole pool (inside its per-session limits); another
// engine's Store of fresh blocks then failed 64 of 64 and `tuttictl evict --all` evicted nothing.
// Now pins hold at most a set share of the pool per user (a quarter here; three quarters in all),
// Stores evict the unpinned rest, and the operator ends the hog's leases, then its session.
TEST(OpsTest, APinHogLeavesRoomForStoresAndTheOperatorEndsIt) {
  TuttidConfig config;
  config.capacity_bytes = 64ull << 20;
  config.object_bytes = 32768;  // 256 KiB blocks: about 240 slots
  config.lease_ttl_ms = 600000;
  config.extra_limits = "max_pinned_pool_share_per_user: 0.25";  // as on a host of four tenants
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  hostengine::KvShape shape;
  shape.layers = 4;
  auto hog = AttachEngine(**daemon, shape, 64);
  ASSERT_TRUE(hog.ok()) << hog.status();
  auto other = AttachEngine(**daemon, shape, 64);
  ASSERT_TRUE(other.ok()) << other.status();
  auto status = AdminStatus(**daemon);
  ASSERT_TRUE(status.ok());
  const uint64_t slots = status->slots_total();
  ASSERT_GT(slots, 100u);

  // The pool full of blocks, then the hog pins one block per Lookup until it is refused.
  hostengine::StoreOptions so;
  so.batch = 32;
  const std::vector<Key> full = hostengine::MakeKeyChain(41, slots);
  const auto filled = hostengine::StoreKeys(*other->client, *other->engine, full, so);
  ASSERT_TRUE(filled.status.ok()) << filled.status;
  ASSERT_EQ(filled.durable, slots);
  uint64_t pinned = 0;
  absl::Status refused;
  for (const Key& k : full) {
    auto lease = hog->client->Lookup({k});
    if (!lease.ok()) {
      refused = lease.status();
      break;
    }
    ASSERT_EQ(lease->hits(), 1u);
    ++pinned;
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("limits.max_pinned_pool_share_per_user = 0.25"),
            std::string::npos)
      << refused;
  EXPECT_EQ(pinned, slots / 4);

  // Another engine's Store of fresh blocks evicts the unpinned ones.
  const std::vector<Key> fresh = hostengine::MakeKeyChain(42, 64);
  const auto stored = hostengine::StoreKeys(*other->client, *other->engine, fresh, so);
  ASSERT_TRUE(stored.status.ok()) << stored.status;
  EXPECT_EQ(stored.durable, 64u) << "failed " << stored.failed << "\n" << (*daemon)->LogTail();

  const std::string ctl = RunfilePath("client/tuttictl");
  const std::string sock = "--socket=" + (*env)->socket();
  CommandResult r = RunCommand({ctl, sock, "evict", "--all", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            absl::StrCat("{\"evicted\":", slots - pinned, ",\"skipped_pinned\":", pinned, "}\n"));
  const std::string hog_id = absl::StrCat(hog->client->session_id());
  r = RunCommand({ctl, sock, "sessions", "--json"});
  EXPECT_NE(r.out.find(absl::StrCat("{\"session_id\":", hog_id, ",\"uid\":", getuid())),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(absl::StrCat("\"pinned_blocks\":", pinned)), std::string::npos) << r.out;
  // The engines are this process, and tuttid inherited its CPUs: every one of them is shared.
  cpu_set_t mine;
  CPU_ZERO(&mine);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  EXPECT_NE(r.out.find(absl::StrCat("\"cpus_shared_with_tuttid\":", CPU_COUNT(&mine), "}")),
            std::string::npos)
      << r.out;
  r = RunCommand({ctl, sock, "sessions"});
  EXPECT_NE(r.out.find(absl::StrCat(" (", CPU_COUNT(&mine), " shared)\n")), std::string::npos)
      << r.out;

  // The operator ends the hog's leases: the session stays, its pins are gone.
  r = RunCommand({ctl, sock, "end-session", hog_id, "--leases-only"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, absl::StrCat("session ", hog_id, ": ", pinned, " leases ended, ", pinned,
                                " pins released; session still attached\n"));
  r = RunCommand({ctl, sock, "evict", "--all", "--json"});
  EXPECT_EQ(r.out, absl::StrCat("{\"evicted\":", pinned, ",\"skipped_pinned\":0}\n"));
  // The uid's share is free again: the other engine stores and pins.
  const auto again = hostengine::StoreKeys(*other->client, *other->engine, fresh, so);
  ASSERT_TRUE(again.status.ok()) << again.status;
  auto lease = other->client->Lookup(absl::MakeConstSpan(fresh).subspan(0, 32));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->hits(), 32u);
  ASSERT_TRUE(other->client->Release(lease->lease_id()).ok());

  // Then the whole session: its engine's next call finds none.
  r = RunCommand({ctl, sock, "end-session", hog_id, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            absl::StrCat("{\"session_id\":", hog_id,
                         ",\"leases_ended\":0,\"pins_released\":0,\"session_closed\":true}\n"));
  EXPECT_EQ(hog->client->Lookup(fresh).status().code(), absl::StatusCode::kNotFound);
  r = RunCommand({ctl, sock, "end-session", hog_id});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown"), std::string::npos) << r.err;
  r = RunCommand({ctl, sock, "end-session", "x"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
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
