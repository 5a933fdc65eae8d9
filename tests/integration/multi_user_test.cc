// The documented deployment with real users and groups (docs/security.md): tuttid runs as its own
// user, its engine socket is 0660 in that user's group, the engine user has the group as a
// supplementary group; a hostile second member of the group and a stranger try what issue 9
// section 1 found possible. Needs root (to become those users); skips itself otherwise.
//
// Users are numeric ids the kernel knows without /etc/passwd entries. The parent test process
// never touches gRPC: every party runs in a forked child that takes its identity first.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/hostengine/connect.h"
#include "client/hostengine/engine_client.h"
#include "client/hostengine/host_engine.h"
#include "daemon/common/handoff.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/common/daemon_launch.h"
#include "tutti/v1/admin.grpc.pb.h"

namespace tutti::testing {
namespace {

constexpr uid_t kTuttiUid = 64101, kEngineUid = 64102, kHostileUid = 64103, kStrangerUid = 64104;
constexpr gid_t kTuttiGid = 64101, kEngineGid = 64102, kHostileGid = 64103, kStrangerGid = 64104;

struct Identity {
  uid_t uid;
  gid_t gid;
  std::vector<gid_t> groups;
};

void BecomeOrDie(const Identity& id) {
  if (setgroups(id.groups.size(), id.groups.data()) != 0 || setresgid(id.gid, id.gid, id.gid) != 0 ||
      setresuid(id.uid, id.uid, id.uid) != 0) {
    std::fprintf(stderr, "cannot become uid %u: %s\n", id.uid, strerror(errno));
    _exit(99);
  }
}

// True when a child can switch to the test's uids (not in every container).
bool CanBecomeOthers() {
  const pid_t pid = fork();
  if (pid == 0) {
    const gid_t groups[] = {kTuttiGid};
    _exit(setgroups(1, groups) == 0 && setresgid(kEngineGid, kEngineGid, kEngineGid) == 0 &&
                  setresuid(kEngineUid, kEngineUid, kEngineUid) == 0
              ? 0
              : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Runs `party` as `id` in a child; returns what it reported ("" = all its checks held).
std::string RunAs(const Identity& id, const std::function<std::string()>& party) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    BecomeOrDie(id);
    const std::string result = party();
    (void)!write(fds[1], result.data(), result.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    out += absl::StrCat(" (the party exited with status ", status, ")");
  }
  return out;
}

std::string Expect(bool ok, const std::string& what) { return ok ? "" : what + "; "; }

class MultiUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to take on other users' identities";
    if (!CanBecomeOthers()) {
      GTEST_SKIP() << "this root cannot take on other uids (no CAP_SETUID, or a user namespace "
                      "that does not map them)";
    }
    auto base = MakeTempDir("/tmp/tutti-mu-XXXXXX");
    ASSERT_TRUE(base.ok()) << base.status();
    base_ = *base;
    chmod(base_.c_str(), 0755);
    // As tmpfiles.d makes them: /var/lib/tutti and /run/tutti, 0750 tutti:tutti.
    for (const std::string d : {"/state", "/run"}) {
      ASSERT_EQ(mkdir((base_ + d).c_str(), 0750), 0);
      ASSERT_EQ(chown((base_ + d).c_str(), kTuttiUid, kTuttiGid), 0);
    }
    socket_ = base_ + "/run/tuttid.sock";
    const std::string config = base_ + "/tuttid.textproto";
    std::ofstream(config) << "state_dir: \"" << base_ << "/state\"\n"
                          << "listen { socket_path: \"" << socket_
                          << "\" socket_mode: 0660 socket_group: \"\" }\n"
                             "pool { capacity_bytes: 67108864 object_bytes: 4096 max_objects: 8 }\n"
                             "io { backend: \"memory\" }\n"
                             "dram { capacity_bytes: 0 }\n"
                             "limits { store_staging_bytes: 4194304 retrieve_staging_bytes: "
                             "33554432 max_blocks_per_call: 64 "
                          << ExtraLimits() << " }\n"
                          << "gpu { mode: \"host\" }\n"
                          << MetricsBlock() << "\n"
                          << ExtraConfig() << "\n";
    log_ = base_ + "/tuttid.log";
    // Bazel's runfiles live under root's 0700 home: give the daemon's user a copy it can run.
    const std::string binary = base_ + "/tuttid";
    std::filesystem::copy_file(TuttidBinary(), binary);
    ASSERT_EQ(chmod(binary.c_str(), 0755), 0);
    daemon_ = fork();
    if (daemon_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int log = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(log, 1);
      dup2(log, 2);
      BecomeOrDie({kTuttiUid, kTuttiGid, {}});  // as tuttid@.service: User=tutti Group=tutti
      execl(binary.c_str(), binary.c_str(), ("--config=" + config).c_str(), nullptr);
      _exit(127);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (access((socket_ + ".admin").c_str(), F_OK) != 0 || access(socket_.c_str(), F_OK) != 0) {
      ASSERT_LT(absl::Now(), deadline) << FileTail(log_, 4000);
      ASSERT_EQ(WaitForExit(daemon_, absl::Milliseconds(50)), -1) << FileTail(log_, 4000);
    }
  }
  // Hooks for fixtures of one topic: more limits fields (inside `limits { }`), the metrics block,
  // and more top-level blocks (none of limits, gpu, metrics, pool, io, dram, listen, state_dir).
  virtual std::string ExtraLimits() { return ""; }
  virtual std::string MetricsBlock() { return "metrics { listen: \"off\" }"; }
  virtual std::string ExtraConfig() { return ""; }

  void TearDown() override {
    if (daemon_ > 0) KillAndReap(daemon_);
    if (!base_.empty()) std::filesystem::remove_all(base_);
  }

  std::string base_, socket_, log_;
  pid_t daemon_ = -1;
};

// A 0600 shm object of `owner` with known bytes: another user's engine memory.
std::string MakeVictim(const std::string& tag, uid_t owner) {
  const std::string name = absl::StrCat("/tutti-mu-", tag, "-", getpid());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  EXPECT_GE(fd, 0) << strerror(errno);
  EXPECT_EQ(ftruncate(fd, 1 << 20), 0);
  EXPECT_EQ(pwrite(fd, "victim's KV", 11, 0), 11);
  EXPECT_EQ(fchown(fd, owner, owner), 0);
  close(fd);
  return name;
}

bool Untouched(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  char buf[11] = {};
  const bool same = fd >= 0 && pread(fd, buf, 11, 0) == 11 && std::memcmp(buf, "victim's KV", 11) == 0;
  if (fd >= 0) close(fd);
  shm_unlink(name.c_str());
  return same;
}

TEST_F(MultiUserTest, TheDocumentedDeploymentWorksAndNoOtherUserReachesAnEnginesMemory) {
  const std::string victim = MakeVictim("engine", kEngineUid);
  const std::string root_only = MakeVictim("root", 0);
  const std::string sock = socket_;

  // The engine: in the socket's group as a supplementary group, its memory 0600 and its own.
  EXPECT_EQ(RunAs({kEngineUid, kEngineGid, {kTuttiGid}}, [&] {
              auto engine = hostengine::HostEngine::Create(
                  {2, 2, 64, 2, 16, tutti::v1::KV_FORMAT_SEPARATE}, 8, "tutti-mu");
              if (!engine.ok()) return std::string(engine.status().message());
              auto channel = hostengine::ConnectToTuttid(sock, absl::Seconds(5));
              if (!channel.ok()) return std::string(channel.status().message());
              hostengine::EngineClient client(*channel, sock, absl::Seconds(30));
              auto attach = client.Attach((*engine)->MakeAttachRequest({}), (*engine)->fds());
              if (!attach.ok()) return "attach: " + std::string(attach.status().message());
              (*engine)->region().Unlink();
              std::vector<Key> keys;
              for (uint64_t i = 0; i < 4; ++i) {
                Key k;
                k.bytes[0] = static_cast<uint8_t>(i + 1);
                keys.push_back(k);
                (*engine)->FillBlock(i, k);
              }
              const std::vector<uint32_t> blocks = {0, 1, 2, 3}, into = {4, 5, 6, 7};
              auto stored = client.Store(keys, blocks, /*wait_durable=*/true);
              if (!stored.ok()) return "store: " + std::string(stored.status().message());
              auto lookup = client.Lookup(keys);
              if (!lookup.ok() || lookup->hits() != 4) return std::string("lookup missed");
              auto got = client.Retrieve(lookup->lease_id(), keys, into);
              if (!got.ok() || !got->failed.empty()) return std::string("retrieve failed");
              uint64_t bad = 0;
              for (int i = 0; i < 4; ++i) bad += (*engine)->VerifyBlock(into[i], keys[i]);
              return Expect(bad == 0, absl::StrCat(bad, " wrong bytes"));
            }),
            "");

  // A hostile member of the socket's group.
  EXPECT_EQ(RunAs({kHostileUid, kHostileGid, {kTuttiGid}}, [&] {
              std::string r;
              // It cannot open the victim's memory, so it cannot hand it over...
              r += Expect(shm_open(victim.c_str(), O_RDWR, 0) < 0 && errno == EACCES,
                          "opened the victim's shm");
              r += Expect(shm_open(root_only.c_str(), O_RDWR, 0) < 0, "opened root's shm");
              // ... and naming it, as v1 allowed, is refused.
              auto channel = hostengine::ConnectToTuttid(sock, absl::Seconds(5));
              if (!channel.ok()) return "connect: " + std::string(channel.status().message());
              auto stub = tutti::v1::KvCache::NewStub(*channel);
              tutti::v1::AttachRequest req;
              req.set_engine_id("hostile");
              auto* ns = req.mutable_namespace_();
              ns->set_model_id("m");
              ns->set_hash_scheme("h");
              ns->set_tp_size(1);
              auto* l = ns->mutable_layout();
              l->set_num_layers(1);
              l->set_kv_heads(1);
              l->set_head_dim(2048);
              l->set_dtype_bytes(2);
              l->set_block_tokens(1);
              l->set_format(tutti::v1::KV_FORMAT_MLA);
              auto* shm = req.add_regions()->mutable_host_shm();
              shm->set_name(victim);
              shm->set_size_bytes(1 << 20);
              auto* p = req.add_placements();
              p->set_block_stride(4096);
              req.set_num_blocks(1);
              for (const std::string& credential : {std::string(), std::string(16, 'x')}) {
                req.set_credential(credential);
                grpc::ClientContext ctx;
                tutti::v1::AttachResponse resp;
                const grpc::Status s = stub->Attach(&ctx, req, &resp);
                r += Expect(s.error_code() == grpc::StatusCode::PERMISSION_DENIED,
                            "attach by name: " + s.error_message());
              }
              // Forged log lines are refused.
              auto credential = HandOff(sock, {});
              if (!credential.ok()) return "handoff: " + std::string(credential.status().message());
              req.set_credential(*credential);
              req.set_engine_id("x\n2026-12-01 [main] [info] forged");
              req.clear_regions();
              grpc::ClientContext ctx;
              tutti::v1::AttachResponse resp;
              r += Expect(stub->Attach(&ctx, req, &resp).error_code() ==
                              grpc::StatusCode::INVALID_ARGUMENT,
                          "a newline in engine_id was accepted");
              // The operator API: not on the engine socket, and its own socket is closed to it.
              auto admin = tutti::v1::Admin::NewStub(*channel);
              tutti::v1::EvictRequest evict;
              evict.set_all(true);
              tutti::v1::EvictResponse evicted;
              grpc::ClientContext ectx;
              r += Expect(admin->Evict(&ectx, evict, &evicted).error_code() ==
                              grpc::StatusCode::UNIMPLEMENTED,
                          "Evict answered on the engine socket");
              auto admin_channel = hostengine::ConnectToTuttid(sock + ".admin", absl::Seconds(2));
              r += Expect(!admin_channel.ok(), "reached the operator socket");
              return r;
            }),
            "");

  // A user outside the group reaches nothing.
  EXPECT_EQ(RunAs({kStrangerUid, kStrangerGid, {}}, [&] {
              std::string r;
              r += Expect(!hostengine::ConnectToTuttid(sock, absl::Seconds(2)).ok(),
                          "reached the engine socket");
              r += Expect(!HandOff(sock, {}).ok(), "reached the handoff socket");
              return r;
            }),
            "");

  // The operator (root) sees the engine's session gone and the blocks kept.
  EXPECT_EQ(RunAs({0, 0, {}}, [&] {
              auto channel = hostengine::ConnectToTuttid(sock + ".admin", absl::Seconds(5));
              if (!channel.ok()) return std::string(channel.status().message());
              grpc::ClientContext ctx;
              tutti::v1::StatsResponse stats;
              const grpc::Status s =
                  tutti::v1::Admin::NewStub(*channel)->Stats(&ctx, {}, &stats);
              if (!s.ok()) return s.error_message();
              return Expect(stats.blocks_stored() == 4, absl::StrCat(stats.blocks_stored(),
                                                                     " blocks stored, not 4"));
            }),
            "");
  EXPECT_TRUE(Untouched(victim));
  EXPECT_TRUE(Untouched(root_only));
}

// --- Sessions belong to their engine (issue 19, item 1) ---

// --- Pins and the operator ending leases (issue 19, item 2) ---

// --- Namespaces: per user, scoped, removable; capacity share (issue 19, items 2 and 3) ---

// The engines of this section: 2 layers of K and V, 4 KiB objects, 8 blocks of memory (or none).
hostengine::KvShape NsShape() { return {2, 2, 64, 2, 16, tutti::v1::KV_FORMAT_SEPARATE}; }

Key NsKey(uint32_t i) {
  Key k;
  std::memcpy(k.bytes.data(), &i, sizeof(i));
  k.bytes[15] = 0x5a;
  return k;
}

std::vector<Key> NsKeys(uint32_t first, uint32_t n) {
  std::vector<Key> keys;
  for (uint32_t i = first; i < first + n; ++i) keys.push_back(NsKey(i));
  return keys;
}

// An engine of the party's user, attached to `model` (with `secret`, if not empty).
struct NsEngine {
  std::unique_ptr<hostengine::HostEngine> memory;  // null: memory-less
  std::unique_ptr<hostengine::EngineClient> client;
  tutti::v1::AttachResponse attached;
  std::string error;  // why it did not attach

  // Stores keys[i] from engine block i % 8, 8 at a time; "" when every block became durable.
  std::string Store(const std::vector<Key>& keys) {
    for (size_t at = 0; at < keys.size(); at += 8) {
      std::vector<Key> batch(keys.begin() + at, keys.begin() + std::min(keys.size(), at + 8));
      std::vector<uint32_t> blocks;
      for (uint32_t b = 0; b < batch.size(); ++b) {
        memory->FillBlock(b, batch[b]);
        blocks.push_back(b);
      }
      auto stored = client->Store(batch, blocks, /*wait_durable=*/true);
      if (!stored.ok()) return "store: " + std::string(stored.status().message());
      for (auto o : *stored) {
        if (o != tutti::v1::STORE_DURABLE) return absl::StrCat("store outcome ", o);
      }
    }
    return "";
  }
  // Leading hits of `keys`, looked up 64 at a time (limits.max_blocks_per_call here).
  uint32_t Hits(const std::vector<Key>& keys) {
    uint32_t hits = 0;
    for (size_t at = 0; at < keys.size(); at += 64) {
      std::vector<Key> chunk(keys.begin() + at, keys.begin() + std::min(keys.size(), at + 64));
      auto r = client->Lookup(chunk);
      if (!r.ok()) return hits;
      if (r->lease_id() != 0) (void)client->Release(r->lease_id());
      hits += r->hits();
      if (r->hits() < chunk.size()) break;
    }
    return hits;
  }
};

NsEngine AttachNs(const std::string& sock, const std::string& model, bool with_memory,
                  const std::string& secret = "") {
  NsEngine e;
  auto memory = hostengine::HostEngine::Create(NsShape(), 8, "tutti-mu-ns");
  if (!memory.ok()) {
    e.error = std::string(memory.status().message());
    return e;
  }
  hostengine::EngineIdentity id;
  id.engine_id = "mu-ns";
  id.model_id = model;
  tutti::v1::AttachRequest req = (*memory)->MakeAttachRequest(id);
  req.set_namespace_secret(secret);
  std::vector<int> fds = (*memory)->fds();
  if (!with_memory) {
    req.clear_regions();
    req.clear_placements();
    req.set_num_blocks(0);
    fds.clear();
  }
  auto channel = hostengine::ConnectToTuttid(sock, absl::Seconds(5));
  if (!channel.ok()) {
    e.error = std::string(channel.status().message());
    return e;
  }
  e.client = std::make_unique<hostengine::EngineClient>(*channel, sock, absl::Seconds(30));
  auto attached = e.client->Attach(req, fds);
  (*memory)->region().Unlink();
  if (!attached.ok()) {
    e.error = attached.status().ToString();
    return e;
  }
  e.attached = *attached;
  if (with_memory) e.memory = std::move(memory).value();
  return e;
}

// The first message of a WatchEvents of `e`'s session resuming after `after_seq` of `boot_id`.
// (A raw call: EngineClient has no WatchEvents helper.)
tutti::v1::WatchEventsResponse FirstEvents(NsEngine& e, uint64_t after_seq, uint64_t boot_id) {
  tutti::v1::WatchEventsRequest req;
  req.set_session_id(e.client->session_id());
  req.set_after_seq(after_seq);
  req.set_boot_id(boot_id);
  auto ctx = e.client->NewContext();
  auto reader = e.client->stub().WatchEvents(ctx.get(), req);
  tutti::v1::WatchEventsResponse first;
  if (!reader->Read(&first)) first.set_boot_id(0);
  ctx->TryCancel();
  return first;
}

// What a watcher of `model` sees of its history: the run's boot id from one session's stream,
// then the events after seq 1 from another's (one stream per session). "events N resumed B".
std::string HistorySeen(const std::string& sock, const std::string& model,
                        const std::string& secret = "") {
  NsEngine first = AttachNs(sock, model, false, secret);
  NsEngine second = AttachNs(sock, model, false, secret);
  if (!first.error.empty() || !second.error.empty()) return first.error + second.error;
  const uint64_t boot = FirstEvents(first, 0, 0).boot_id();
  const tutti::v1::WatchEventsResponse history = FirstEvents(second, 1, boot);
  return absl::StrCat("events ", history.events_size(), " resumed ", history.resumed());
}

// The operator's view (run as root): the namespaces' owners and blocks, as "uid:blocks ...".
std::string NamespaceOwners(const std::string& sock, uint64_t* slots_total = nullptr) {
  auto channel = hostengine::ConnectToTuttid(sock + ".admin", absl::Seconds(5));
  if (!channel.ok()) return std::string(channel.status().message());
  grpc::ClientContext ctx;
  tutti::v1::StatsResponse stats;
  const grpc::Status s = tutti::v1::Admin::NewStub(*channel)->Stats(&ctx, {}, &stats);
  if (!s.ok()) return s.error_message();
  if (slots_total != nullptr) *slots_total = stats.slots_total();
  std::vector<std::string> rows;
  for (const auto& ns : stats.namespaces()) {
    rows.push_back(
        absl::StrCat(ns.shared() ? "shared" : "uid", ns.owner_uid(), ":", ns.blocks_ssd()));
  }
  std::sort(rows.begin(), rows.end());
  return absl::StrJoin(rows, " ");
}

const Identity kNsEngine{kEngineUid, kEngineGid, {kTuttiGid}};
const Identity kNsHostile{kHostileUid, kHostileGid, {kTuttiGid}};
const Identity kNsOperator{0, 0, {}};

TEST_F(MultiUserTest, AnotherUserNamingTheModelSeesNoneOfItsBlocksOrEventsUnlessGivenTheSecret) {
  const std::string sock = socket_;
  EXPECT_EQ(RunAs(kNsEngine,
                  [&] {
                    NsEngine e = AttachNs(sock, "mu-model", true);
                    if (!e.error.empty()) return e.error;
                    std::string r = e.Store(NsKeys(1, 4));
                    NsEngine salted = AttachNs(sock, "mu-model", true, std::string(32, 'k'));
                    if (!salted.error.empty()) return r + salted.error;
                    return r + salted.Store(NsKeys(1, 4));
                  }),
            "");
  EXPECT_EQ(RunAs(kNsHostile,
                  [&] {
                    NsEngine e = AttachNs(sock, "mu-model", false);
                    if (!e.error.empty()) return e.error;
                    std::string r =
                        Expect(e.Hits(NsKeys(1, 4)) == 0, "hits on the other user's blocks");
                    const std::string seen = HistorySeen(sock, "mu-model");
                    r += Expect(seen == "events 0 resumed 0", "another user's history: " + seen);
                    NsEngine wrong = AttachNs(sock, "mu-model", false, std::string(32, 'w'));
                    r += Expect(wrong.error.empty() && wrong.Hits(NsKeys(1, 4)) == 0,
                                "a wrong secret hit " + wrong.error);
                    // Given the secret, it shares that namespace (and only that one).
                    NsEngine given = AttachNs(sock, "mu-model", false, std::string(32, 'k'));
                    r += Expect(given.error.empty() && given.Hits(NsKeys(1, 4)) == 4,
                                "the secret's namespace missed " + given.error);
                    const std::string shared = HistorySeen(sock, "mu-model", std::string(32, 'k'));
                    r += Expect(shared == "events 3 resumed 1", "the secret's history: " + shared);
                    return r;
                  }),
            "");
  // The owner's other engines share its namespace.
  EXPECT_EQ(RunAs(kNsEngine,
                  [&] {
                    NsEngine e = AttachNs(sock, "mu-model", false);
                    return e.error +
                           Expect(e.Hits(NsKeys(1, 4)) == 4, "the owner's namespace missed");
                  }),
            "");
  EXPECT_EQ(RunAs(kNsOperator, [&] { return NamespaceOwners(sock); }),
            absl::StrCat("shared", kEngineUid, ":4 shared", kHostileUid, ":0 uid", kEngineUid,
                         ":4 uid", kHostileUid, ":0"));
}

class HostSharedNamespacesTest : public MultiUserTest {
 protected:
  std::string ExtraConfig() override { return "security { namespace_sharing: \"host\" }"; }
};

TEST_F(HostSharedNamespacesTest, EveryUserSharesAModelsNamespaceWhenTheOperatorSaysSo) {
  const std::string sock = socket_;
  EXPECT_EQ(RunAs(kNsEngine,
                  [&] {
                    NsEngine e = AttachNs(sock, "mu-model", true);
                    return e.error + e.Store(NsKeys(1, 4));
                  }),
            "");
  EXPECT_EQ(RunAs(kNsHostile,
                  [&] {
                    NsEngine e = AttachNs(sock, "mu-model", false);
                    std::string r = e.error + Expect(e.Hits(NsKeys(1, 4)) == 4, "shared: missed");
                    const std::string seen = HistorySeen(sock, "mu-model");
                    return r + Expect(seen == "events 3 resumed 1", "shared history: " + seen);
                  }),
            "");
}

class NamespaceBoundsTest : public MultiUserTest {
 protected:
  std::string ExtraLimits() override { return "max_namespaces_per_user: 3 max_namespaces: 5"; }
};

TEST_F(NamespaceBoundsTest, OneUserFillingItsNamespacesLeavesOthersAttachingNewModels) {
  const std::string sock = socket_;
  EXPECT_EQ(RunAs(kNsHostile,
                  [&] {
                    std::string r;
                    // Attach and detach of fresh models, as fast as it goes: each takes the place
                    // of an idle one.
                    for (int i = 0; i < 20 && r.empty(); ++i) {
                      NsEngine e = AttachNs(sock, absl::StrCat("churn-", i), false);
                      r += e.error;
                    }
                    // Held by sessions, its namespaces stop at its bound, naming it.
                    std::vector<NsEngine> held;
                    for (int i = 0; i < 3; ++i)
                      held.push_back(AttachNs(sock, absl::StrCat("held-", i), false));
                    for (const NsEngine& e : held) r += e.error;
                    NsEngine fourth = AttachNs(sock, "held-3", false);
                    r += Expect(fourth.error.find("RESOURCE_EXHAUSTED") != std::string::npos &&
                                    fourth.error.find("limits.max_namespaces_per_user") !=
                                        std::string::npos,
                                "a fourth namespace: " + fourth.error);
                    return r;
                  }),
            "");
  EXPECT_EQ(RunAs(kNsEngine,
                  [&] {
                    NsEngine e = AttachNs(sock, "a-new-model", true);
                    return e.error + e.Store(NsKeys(1, 2));
                  }),
            "");
  const std::string owners = RunAs(kNsOperator, [&] { return NamespaceOwners(sock); });
  EXPECT_NE(owners.find(absl::StrCat("uid", kEngineUid, ":2")), std::string::npos) << owners;
  EXPECT_LE(std::count(owners.begin(), owners.end(), ':'), 5) << owners;
}

class CapacityShareTest : public MultiUserTest {
 protected:
  std::string ExtraLimits() override { return "pool_share_per_user: 0.25"; }
};

TEST_F(CapacityShareTest, AUserPastItsShareEvictsItsOwnBlocksNotTheOtherUsers) {
  const std::string sock = socket_;
  uint64_t slots = 0;
  const std::string total = RunAs(kNsOperator, [&] {
    uint64_t n = 0;
    NamespaceOwners(sock, &n);
    return absl::StrCat(n);
  });
  ASSERT_TRUE(absl::SimpleAtoi(total, &slots)) << total;
  const uint32_t share = static_cast<uint32_t>(slots / 4);
  EXPECT_EQ(RunAs(kNsEngine,
                  [&] {
                    NsEngine e = AttachNs(sock, "mu-model", true);
                    return e.error + e.Store(NsKeys(0, 40));
                  }),
            "");
  EXPECT_EQ(RunAs(kNsHostile,
                  [&] {
                    NsEngine e = AttachNs(sock, "junk", true);
                    std::string r = e.error + e.Store(NsKeys(1000, share + 40));
                    // Its own oldest blocks made room; its latest are all there.
                    r += Expect(e.Hits(NsKeys(1000, 1)) == 0, "its oldest block was kept");
                    return r +
                           Expect(e.Hits(NsKeys(1000 + 40, share)) == share, "its latest missed");
                  }),
            "");
  EXPECT_EQ(RunAs(kNsEngine,
                  [&] {
                    NsEngine e = AttachNs(sock, "mu-model", false);
                    return e.error +
                           Expect(e.Hits(NsKeys(0, 40)) == 40, "the other user's blocks went");
                  }),
            "");
  EXPECT_EQ(RunAs(kNsOperator, [&] { return NamespaceOwners(sock); }),
            absl::StrCat("uid", kEngineUid, ":40 uid", kHostileUid, ":", share));
}

// --- The compute model belongs to the namespace owner (issue 19, item 3) ---

// --- The handoff socket and the metrics endpoint (issue 19, items 2 and 4) ---

}  // namespace
}  // namespace tutti::testing
