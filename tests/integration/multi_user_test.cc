// The documented deployment with real users and groups (docs/security.md): tuttid runs as its own
// user, its engine socket is 0660 in that user's group, the engine user has the group as a
// supplementary group; a hostile second member of the group and a stranger try what issue 9
// section 1 found possible. Needs root (to become those users); skips itself otherwise.
//
// Users are numeric ids the kernel knows without /etc/passwd entries. The parent test process
// never touches gRPC: every party runs in a forked child that takes its identity first.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
#include "client/hostengine/engine_client.h"
#include "client/hostengine/host_engine.h"
#include "common/connect.h"
#include "common/handoff.h"
#include "daemon/metrics/http_get.h"
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
    // Ready once the sockets exist AND have their configured mode: tuttid binds them owner-only
    // and opens them to the group right after, so a party that connects in between (seen in CI)
    // gets EACCES.
    auto open_to_group = [](const std::string& path) {
      struct stat st;
      return stat(path.c_str(), &st) == 0 && (st.st_mode & 0777) == 0660;
    };
    while (access((socket_ + ".admin").c_str(), F_OK) != 0 || !open_to_group(socket_) ||
           !open_to_group(socket_ + ".handoff")) {
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
              auto channel = ConnectToTuttid(sock, absl::Seconds(5));
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
              auto channel = ConnectToTuttid(sock, absl::Seconds(5));
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
              auto admin_channel = ConnectToTuttid(sock + ".admin", absl::Seconds(2));
              r += Expect(!admin_channel.ok(), "reached the operator socket");
              return r;
            }),
            "");

  // A user outside the group reaches nothing.
  EXPECT_EQ(RunAs({kStrangerUid, kStrangerGid, {}}, [&] {
              std::string r;
              r += Expect(!ConnectToTuttid(sock, absl::Seconds(2)).ok(),
                          "reached the engine socket");
              r += Expect(!HandOff(sock, {}).ok(), "reached the handoff socket");
              return r;
            }),
            "");

  // The operator (root) sees the engine's session gone and the blocks kept.
  EXPECT_EQ(RunAs({0, 0, {}}, [&] {
              auto channel = ConnectToTuttid(sock + ".admin", absl::Seconds(5));
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

// Every call of the engine API naming sessions [1, kProbedIds) with no token, with the prober's
// own session's token and with 16 random bytes, from a process that attached only its own
// memory-less session. Returns "" when every call that named another session was answered
// exactly as an unknown session; otherwise what got through.
constexpr uint64_t kProbedIds = 64;

std::string ProbeOthersSessions(const std::string& sock, const std::string& who) {
  auto engine = hostengine::HostEngine::Create({2, 2, 64, 2, 16, tutti::v1::KV_FORMAT_SEPARATE}, 1,
                                               "tutti-mu-probe");
  if (!engine.ok()) return std::string(engine.status().message());
  auto channel = ConnectToTuttid(sock, absl::Seconds(5));
  if (!channel.ok()) return "connect: " + std::string(channel.status().message());
  hostengine::EngineClient self(*channel, sock, absl::Seconds(30));
  tutti::v1::AttachRequest memoryless = (*engine)->MakeAttachRequest({});
  memoryless.clear_regions();
  memoryless.clear_placements();
  memoryless.set_num_blocks(0);
  auto attached = self.Attach(memoryless, {});
  if (!attached.ok()) return "attach: " + std::string(attached.status().message());
  std::string random(16, '\0');
  std::ifstream("/dev/urandom").read(random.data(), 16);
  auto stub = tutti::v1::KvCache::NewStub(*channel);
  std::string r;
  uint64_t probes = 0;
  for (uint64_t id = 1; id < kProbedIds; ++id) {
    for (const std::string& token : {std::string(), self.session_token(), random}) {
      if (id == self.session_id() && token == self.session_token()) continue;
      auto named = [&](auto* req) {
        req->set_session_id(id);
        req->set_session_token(token);
      };
      std::vector<std::pair<const char*, grpc::Status>> got;
      {
        tutti::v1::KeepAliveRequest q;
        named(&q);
        tutti::v1::KeepAliveResponse a;
        grpc::ClientContext c;
        got.emplace_back("KeepAlive", stub->KeepAlive(&c, q, &a));
      }
      {
        tutti::v1::LookupRequest q;
        named(&q);
        q.add_keys(std::string(16, '\1'));
        tutti::v1::LookupResponse a;
        grpc::ClientContext c;
        got.emplace_back("Lookup", stub->Lookup(&c, q, &a));
      }
      {
        tutti::v1::ReportComputeRequest q;
        named(&q);
        auto* sample = q.add_samples();
        sample->set_new_tokens(16);
        sample->set_context_tokens(16);
        sample->set_layer_ms(1);
        tutti::v1::ReportComputeResponse a;
        grpc::ClientContext c;
        got.emplace_back("ReportCompute", stub->ReportCompute(&c, q, &a));
      }
      {
        tutti::v1::StoreRequest q;
        named(&q);
        auto* b = q.add_blocks();
        b->set_key(std::string(16, '\7'));
        b->set_engine_block(0);
        tutti::v1::StoreResponse a;
        grpc::ClientContext c;
        got.emplace_back("Store", stub->Store(&c, q, &a));
      }
      {
        tutti::v1::RetrieveRequest q;
        named(&q);
        for (uint64_t lease = 1; lease < 8; ++lease) q.add_lease_ids(lease);
        auto* b = q.add_blocks();
        b->set_key(std::string(16, '\1'));
        b->set_engine_block(0);
        grpc::ClientContext c;
        auto reader = stub->Retrieve(&c, q);
        tutti::v1::RetrieveProgress p;
        while (reader->Read(&p)) {
        }
        got.emplace_back("Retrieve", reader->Finish());
      }
      {
        tutti::v1::WatchEventsRequest q;
        named(&q);
        grpc::ClientContext c;
        auto reader = stub->WatchEvents(&c, q);
        tutti::v1::WatchEventsResponse m;
        if (reader->Read(&m)) {
          c.TryCancel();
          while (reader->Read(&m)) {
          }
          got.emplace_back("WatchEvents", grpc::Status::OK);
        } else {
          got.emplace_back("WatchEvents", reader->Finish());
        }
      }
      for (uint64_t lease = 1; lease < 4; ++lease) {
        tutti::v1::ReleaseRequest q;
        named(&q);
        q.set_lease_id(lease);
        tutti::v1::ReleaseResponse a;
        grpc::ClientContext c;
        got.emplace_back("Release", stub->Release(&c, q, &a));
      }
      {
        tutti::v1::DetachRequest q;
        named(&q);
        tutti::v1::DetachResponse a;
        grpc::ClientContext c;
        got.emplace_back("Detach", stub->Detach(&c, q, &a));
      }
      const std::string unknown = absl::StrCat("session ", id, " is unknown or expired");
      for (const auto& [rpc, status] : got) {
        ++probes;
        if (status.error_code() != grpc::StatusCode::NOT_FOUND ||
            status.error_message() != unknown) {
          r += absl::StrCat(who, ": ", rpc, " of session ", id, " with a ", token.size(),
                            "-byte token: ", status.error_code(), " ", status.error_message(),
                            "; ");
        }
      }
    }
  }
  r += Expect(probes > 8 * 3 * (kProbedIds - 2), absl::StrCat("only ", probes, " probes"));
  r += Expect(self.Detach().ok(), who + ": its own Detach failed");
  return r;
}

// Issue 19, item 1: a user who never attached found another user's live session by KeepAlive
// over ids 1..199 and acted in it. Now neither a member of the socket group (another uid) nor
// another process of the engine's own uid gets anything but "unknown session" for any call naming
// it, and the engine's session, lease, blocks and memory are as they were.
TEST_F(MultiUserTest, OnlyTheEngineThatAttachedActsInItsSession) {
  const std::string sock = socket_;
  int ready[2], go[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t engine_pid = fork();
  if (engine_pid == 0) {
    close(ready[0]);
    close(go[1]);
    close(done[0]);
    BecomeOrDie({kEngineUid, kEngineGid, {kTuttiGid}});
    auto report = [&](const std::string& what) {
      (void)!write(done[1], what.data(), what.size());
      _exit(0);
    };
    auto engine = hostengine::HostEngine::Create({2, 2, 64, 2, 16, tutti::v1::KV_FORMAT_SEPARATE},
                                                 8, "tutti-mu-victim");
    if (!engine.ok()) report(std::string(engine.status().message()));
    auto channel = ConnectToTuttid(sock, absl::Seconds(5));
    if (!channel.ok()) report(std::string(channel.status().message()));
    hostengine::EngineClient client(*channel, sock, absl::Seconds(30));
    auto attach = client.Attach((*engine)->MakeAttachRequest({}), (*engine)->fds());
    if (!attach.ok()) report("attach: " + std::string(attach.status().message()));
    (*engine)->region().Unlink();
    std::vector<Key> keys;
    for (uint64_t i = 0; i < 4; ++i) {
      Key k;
      k.bytes[0] = static_cast<uint8_t>(i + 1);  // block 0's key is 16 bytes of \1 ... and \0
      keys.push_back(k);
      (*engine)->FillBlock(i, k);
    }
    const std::vector<uint32_t> blocks = {0, 1, 2, 3}, into = {4, 5, 6, 7};
    auto stored = client.Store(keys, blocks, /*wait_durable=*/true);
    if (!stored.ok()) report("store: " + std::string(stored.status().message()));
    auto lookup = client.Lookup(keys);
    if (!lookup.ok() || lookup->hits() != 4) report("lookup missed");
    (void)!write(ready[1], "r", 1);
    char c;
    if (read(go[0], &c, 1) != 1) report("no go");
    // After the probes: the same session, its lease, its blocks, its memory.
    std::string r;
    auto got = client.Retrieve(lookup->lease_id(), keys, into);
    r += Expect(got.ok() && got->failed.empty(),
                "the lease is gone: " + std::string(got.status().message()));
    uint64_t bad = 0;
    for (int i = 0; i < 4; ++i) bad += (*engine)->VerifyBlock(blocks[i], keys[i]);
    for (int i = 0; i < 4; ++i) bad += got.ok() ? (*engine)->VerifyBlock(into[i], keys[i]) : 0;
    r += Expect(bad == 0, absl::StrCat(bad, " wrong bytes in the engine's blocks"));
    r += Expect(client.keepalive_failures() == 0, "a KeepAlive of the engine failed");
    r += Expect(client.Detach().ok(), "the engine's own Detach failed: it was detached");
    report(r);
  }
  close(ready[1]);
  close(go[0]);
  close(done[1]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1) << "the engine did not get ready";
  EXPECT_EQ(RunAs({kHostileUid, kHostileGid, {kTuttiGid}},
                  [&] { return ProbeOthersSessions(sock, "another uid in the group"); }),
            "");
  EXPECT_EQ(RunAs({kEngineUid, kEngineGid, {kTuttiGid}},
                  [&] { return ProbeOthersSessions(sock, "another process of the engine's uid"); }),
            "");
  ASSERT_EQ(write(go[1], "g", 1), 1);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(done[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  int status = 0;
  waitpid(engine_pid, &status, 0);
  EXPECT_EQ(out, "");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(ready[0]);
  close(go[1]);
  close(done[0]);
}


// --- Pins and the operator ending leases (issue 19, item 2) ---

// A party that runs in a child as a user in two steps: `first` (its report is read back at once),
// then, once Continue is called, `second`; what the child set up in `first` (an attached engine)
// lives on between them.
class TwoStepParty {
 public:
  TwoStepParty(const Identity& id, std::function<std::string()> first,
               std::function<std::string()> second) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(down[1]);
      close(up[0]);
      BecomeOrDie(id);
      const std::string a = first() + "\n";
      (void)!write(up[1], a.data(), a.size());
      char go = 0;
      if (read(down[0], &go, 1) != 1) _exit(1);
      const std::string b = second();
      (void)!write(up[1], b.data(), b.size());
      _exit(0);
    }
    close(down[0]);
    close(up[1]);
    to_child_ = down[1];
    from_child_ = up[0];
  }
  ~TwoStepParty() {
    if (to_child_ >= 0) close(to_child_);
    if (from_child_ >= 0) close(from_child_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  // The first step's report (without its newline).
  std::string First() {
    std::string out;
    char c;
    while (read(from_child_, &c, 1) == 1 && c != '\n') out += c;
    return out;
  }
  // Runs the second step and returns its report.
  std::string Second() {
    (void)!write(to_child_, "g", 1);
    close(to_child_);
    to_child_ = -1;
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(from_child_, buf, sizeof(buf))) > 0) out.append(buf, n);
    return out;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
};

Key NumberedKey(uint64_t series, uint64_t i) {
  Key k;
  const uint64_t v = series << 32 | i;
  std::memcpy(k.bytes.data(), &v, sizeof(v));
  k.bytes[15] = 0x5a;
  return k;
}

// An engine of 64 blocks of 32 KiB (2 layers), attached as the calling user.
struct MuEngine {
  std::unique_ptr<hostengine::HostEngine> engine;
  std::unique_ptr<hostengine::EngineClient> client;
  std::string error;
};

MuEngine AttachMuEngine(const std::string& sock) {
  MuEngine e;
  auto engine = hostengine::HostEngine::Create({2, 2, 64, 2, 16, tutti::v1::KV_FORMAT_SEPARATE}, 64,
                                               absl::StrCat("tutti-mu-", getpid()));
  if (!engine.ok()) return {nullptr, nullptr, std::string(engine.status().message())};
  e.engine = std::move(*engine);
  auto channel = ConnectToTuttid(sock, absl::Seconds(5));
  if (!channel.ok()) return {nullptr, nullptr, std::string(channel.status().message())};
  e.client = std::make_unique<hostengine::EngineClient>(*channel, sock, absl::Seconds(30));
  auto attach = e.client->Attach(e.engine->MakeAttachRequest({}), e.engine->fds());
  if (!attach.ok()) e.error = "attach: " + std::string(attach.status().message());
  e.engine->region().Unlink();
  return e;
}

// Stores keys [first, first + n) of `series` from the engine's blocks, 64 a call; returns how many
// became durable.
uint64_t StoreSeries(MuEngine& e, uint64_t series, uint64_t first, uint64_t n) {
  uint64_t durable = 0;
  for (uint64_t i = first; i < first + n; i += 64) {
    std::vector<Key> keys;
    std::vector<uint32_t> blocks;
    for (uint64_t j = i; j < std::min(first + n, i + 64); ++j) {
      keys.push_back(NumberedKey(series, j));
      blocks.push_back(static_cast<uint32_t>(j - i));
    }
    auto outcomes = e.client->Store(keys, blocks, /*wait_durable=*/true);
    if (!outcomes.ok()) return durable;
    for (auto o : *outcomes) durable += o == tutti::v1::STORE_DURABLE;
  }
  return durable;
}

std::unique_ptr<tutti::v1::Admin::Stub> OperatorStub(const std::string& sock) {
  auto channel = ConnectToTuttid(sock + ".admin", absl::Seconds(5));
  return channel.ok() ? tutti::v1::Admin::NewStub(*channel) : nullptr;
}

class MultiUserPinsTest : public MultiUserTest {
 protected:
  // As on a host of four tenants: each may pin a quarter of the pool.
  std::string ExtraLimits() override {
    return "lease_ttl_ms: 600000 max_pinned_pool_share_per_user: 0.25";
  }
};

// One user with many Lookups pinned the whole pool: another user's Store of fresh blocks failed
// 64 of 64 and its Lookups were refused; the operator could evict nothing and end nothing.
TEST_F(MultiUserPinsTest, AHogKeepsToItsShareAndTheOperatorEndsItsLeases) {
  const std::string sock = socket_;
  // The pool's slots, read as the operator, for the parties to size their work.
  const std::string slots_text = RunAs({0, 0, {}}, [&] {
    auto admin = OperatorStub(sock);
    grpc::ClientContext ctx;
    tutti::v1::StatusResponse st;
    if (admin == nullptr || !admin->Status(&ctx, {}, &st).ok()) return std::string("0");
    return absl::StrCat(st.slots_total());
  });
  const uint64_t slots = std::strtoull(slots_text.c_str(), nullptr, 10);
  ASSERT_GT(slots, 1000u);

  // The hog fills the pool with its blocks and pins as many as it may, 64 a Lookup, then one.
  MuEngine hog;
  TwoStepParty hog_party(
      {kHostileUid, kHostileGid, {kTuttiGid}},
      [&] {
        hog = AttachMuEngine(sock);
        if (!hog.error.empty()) return hog.error;
        if (StoreSeries(hog, 1, 0, slots) != slots) return std::string("the hog's stores failed");
        uint64_t pinned = 0;
        std::string refused;
        for (uint32_t batch : {64u, 1u}) {
          while (pinned + batch <= slots) {
            std::vector<Key> keys;
            for (uint64_t i = pinned; i < pinned + batch; ++i) keys.push_back(NumberedKey(1, i));
            auto lease = hog.client->Lookup(keys);
            if (!lease.ok()) {
              refused = std::string(lease.status().message());
              break;
            }
            if (lease->hits() != batch) return std::string("the hog's lookup missed");
            pinned += batch;
          }
        }
        return absl::StrCat(hog.client->session_id(), " ", pinned, " ", refused);
      },
      [&] {
        auto lease = hog.client->Lookup({NumberedKey(1, 0)});
        return Expect(lease.status().code() == absl::StatusCode::kNotFound,
                      "the ended session still answers: " + lease.status().ToString());
      });
  const std::string first = hog_party.First();
  uint64_t hog_session = 0, pinned = 0;
  ASSERT_EQ(std::sscanf(first.c_str(), "%lu %lu", &hog_session, &pinned), 2) << first;
  EXPECT_EQ(pinned, slots / 4) << first;
  EXPECT_NE(first.find("limits.max_pinned_pool_share_per_user"), std::string::npos) << first;

  // Another user stores fresh blocks (evicting the hog's unpinned ones) and pins its own.
  EXPECT_EQ(RunAs({kEngineUid, kEngineGid, {kTuttiGid}},
                  [&] {
                    MuEngine e = AttachMuEngine(sock);
                    if (!e.error.empty()) return e.error;
                    std::string r;
                    const uint64_t durable = StoreSeries(e, 2, 0, 64);
                    r += Expect(durable == 64, absl::StrCat("stored ", durable, " of 64"));
                    std::vector<Key> keys;
                    for (uint64_t i = 0; i < 64; ++i) keys.push_back(NumberedKey(2, i));
                    auto lease = e.client->Lookup(keys);
                    r += Expect(lease.ok() && lease->hits() == 64,
                                "lookup of present blocks: " + lease.status().ToString());
                    if (lease.ok())
                      r += Expect(e.client->Release(lease->lease_id()).ok(), "release");
                    return r;
                  }),
            "");

  // The operator evicts around the pins, sees whose they are, and ends the hog's session.
  EXPECT_EQ(
      RunAs({0, 0, {}},
            [&] {
              auto admin = OperatorStub(sock);
              if (admin == nullptr) return std::string("no operator socket");
              std::string r;
              tutti::v1::EvictRequest all;
              all.set_all(true);
              tutti::v1::EvictResponse evicted;
              grpc::ClientContext c1;
              r += Expect(admin->Evict(&c1, all, &evicted).ok(), "evict");
              r += Expect(
                  evicted.skipped_pinned() == pinned && evicted.evicted() == slots - pinned,
                  absl::StrCat("evicted ", evicted.evicted(), ", kept ", evicted.skipped_pinned()));
              grpc::ClientContext c2;
              tutti::v1::SessionsResponse sessions;
              r += Expect(admin->Sessions(&c2, {}, &sessions).ok(), "sessions");
              bool seen = false;
              for (const auto& s : sessions.sessions()) {
                seen |= s.session_id() == hog_session && s.uid() == kHostileUid &&
                        s.pinned_blocks() == pinned;
              }
              r += Expect(seen, "the hog's session is not listed with its uid and pins");
              tutti::v1::EndSessionRequest end;
              end.set_session_id(hog_session);
              tutti::v1::EndSessionResponse ended;
              grpc::ClientContext c3;
              r += Expect(admin->EndSession(&c3, end, &ended).ok(), "end-session");
              r += Expect(ended.session_closed() && ended.pins_released() == pinned,
                          absl::StrCat("ended: ", ended.ShortDebugString()));
              grpc::ClientContext c4;
              r += Expect(admin->Evict(&c4, all, &evicted).ok() && evicted.skipped_pinned() == 0 &&
                              evicted.evicted() == pinned,
                          absl::StrCat("after end-session: evicted ", evicted.evicted(), ", kept ",
                                       evicted.skipped_pinned()));
              return r;
            }),
      "");
  EXPECT_EQ(hog_party.Second(), "");
}

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
  auto channel = ConnectToTuttid(sock, absl::Seconds(5));
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
  e.client->Name(&req);
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
  auto channel = ConnectToTuttid(sock + ".admin", absl::Seconds(5));
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

// Lookup of `keys` with the prompt's length, for the advice (as the engine's scheduler asks).
absl::StatusOr<tutti::v1::LookupResponse> AdvisedLookup(hostengine::EngineClient& client,
                                                        absl::Span<const Key> keys,
                                                        uint32_t prompt_tokens) {
  tutti::v1::LookupRequest req;
  client.Name(&req);
  for (const Key& k : keys) req.add_keys(k.bytes.data(), k.bytes.size());
  req.set_prompt_tokens(prompt_tokens);
  tutti::v1::LookupResponse resp;
  auto ctx = client.NewContext();
  const grpc::Status s = client.stub().Lookup(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpc(s);
  return resp;
}

// ReportCompute in the client's session (the one place that names the session for these calls).
grpc::Status SessionReportCompute(hostengine::EngineClient& client,
                                  tutti::v1::ReportComputeRequest req) {
  client.Name(&req);
  tutti::v1::ReportComputeResponse resp;
  auto ctx = client.NewContext();
  return client.stub().ReportCompute(ctx.get(), req, &resp);
}

// `count` samples of plain prefills of 16, 32, ... tokens at `ms_per_token` per token and layer.
grpc::Status ReportSamples(hostengine::EngineClient& client, double ms_per_token, int count) {
  tutti::v1::ReportComputeRequest req;
  for (int i = 0; i < count; ++i) {
    auto* s = req.add_samples();
    const uint32_t n = 16 * (i + 1);
    s->set_new_tokens(n);
    s->set_context_tokens(n);
    s->set_layer_ms(ms_per_token * n);
  }
  return SessionReportCompute(client, std::move(req));
}

class MultiUserSharedNamespaceTest : public MultiUserTest {
 protected:
  // Both users' engines name one namespace (docs/security.md "Namespaces").
  std::string ExtraConfig() override { return "security { namespace_sharing: \"host\" }"; }
};

// A session of another uid moved a victim's advice from (hits 4, load 4) to (4, load 0) with
// samples that made compute look free; now only the model's owner feeds it.
TEST_F(MultiUserSharedNamespaceTest, AnotherUidsReportComputeLeavesTheAdviceUnchanged) {
  const std::string sock = socket_;
  std::vector<Key> keys;
  for (uint64_t i = 0; i < 4; ++i) keys.push_back(NumberedKey(3, i));
  constexpr uint32_t kPrompt = 4 * 16 + 1;
  // The owner's advice: at 0.01 ms per token and layer, 16 tokens cost far more than loading
  // their 8 KiB layer, so every hit is loaded.
  const auto advice = [&](MuEngine& e) -> std::string {
    auto r = AdvisedLookup(*e.client, keys, kPrompt);
    if (!r.ok()) return "lookup: " + r.status().ToString();
    (void)e.client->Release(r->lease_id());
    return absl::StrCat("hits ", r->hits(), " load ", r->load_blocks());
  };
  EXPECT_EQ(RunAs({kEngineUid, kEngineGid, {kTuttiGid}},
                  [&] {
                    MuEngine e = AttachMuEngine(sock);
                    if (!e.error.empty()) return e.error;
                    if (StoreSeries(e, 3, 0, 4) != 4) return std::string("store failed");
                    const grpc::Status s = ReportSamples(*e.client, 0.01, 8);
                    if (!s.ok()) return "owner's report: " + s.error_message();
                    return advice(e);
                  }),
            "hits 4 load 4");
  EXPECT_EQ(RunAs({kHostileUid, kHostileGid, {kTuttiGid}},
                  [&] {
                    MuEngine e = AttachMuEngine(sock);
                    if (!e.error.empty()) return e.error;
                    std::string r = advice(e) + "; ";
                    const grpc::Status s = ReportSamples(*e.client, 1e-5, 64);
                    r += Expect(s.error_code() == grpc::StatusCode::PERMISSION_DENIED,
                                "another uid's samples: " + s.error_message());
                    tutti::v1::ReportComputeRequest huge;
                    auto* sample = huge.add_samples();
                    sample->set_new_tokens(16);
                    sample->set_context_tokens(16);
                    sample->set_layer_ms(1e300);
                    r += Expect(SessionReportCompute(*e.client, huge).error_code() ==
                                    grpc::StatusCode::INVALID_ARGUMENT,
                                "a sample of 1e300 ms was accepted");
                    return r + advice(e);
                  }),
            "hits 4 load 4; hits 4 load 4");
  EXPECT_EQ(RunAs({kEngineUid, kEngineGid, {kTuttiGid}},
                  [&] {
                    MuEngine e = AttachMuEngine(sock);
                    if (!e.error.empty()) return e.error;
                    return advice(e);
                  }),
            "hits 4 load 4");
}

// --- The handoff socket and the metrics endpoint (issue 19, items 2 and 4) ---

// A party running as `id` in a child while the test goes on. The constructor returns once the
// party wrote its first line (it is ready); Finish() tells it to stop (its `stop` descriptor reads
// end-of-file) and returns the rest of what it wrote ("" = all its checks held).
class Background {
 public:
  Background(const Identity& id, const std::function<std::string(int stop)>& party,
             const std::function<void(int report)>& get_ready) {
    int report[2], stop[2];
    if (pipe(report) != 0 || pipe(stop) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(report[0]);
      close(stop[1]);
      BecomeOrDie(id);
      get_ready(report[1]);
      const std::string result = party(stop[0]);
      (void)!write(report[1], result.data(), result.size());
      _exit(0);
    }
    close(report[1]);
    close(stop[0]);
    report_ = report[0];
    stop_ = stop[1];
    char c;
    while (read(report_, &c, 1) == 1 && c != '\n') ready_ += c;
  }
  const std::string& ready() const { return ready_; }
  std::string Finish() {
    close(stop_);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = read(report_, buf, sizeof(buf))) > 0;) out.append(buf, n);
    close(report_);
    int status = 0;
    waitpid(pid_, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      out += absl::StrCat(" (the party exited with status ", status, ")");
    }
    return out;
  }

 private:
  pid_t pid_ = -1;
  int report_ = -1, stop_ = -1;
  std::string ready_;
};

// A connection to `path` (a SOCK_SEQPACKET unix socket) that sends nothing; -1 on failure.
int ConnectSeqpacket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// What tuttid answered on `fd` within 10 s ("" for nothing).
std::string AnswerOf(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 10000) != 1) return "";
  char buf[512];
  const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
  return n > 0 ? std::string(buf, n) : "";
}

// The engine user attaches (handing its memory over), stores and finds 4 blocks, and detaches,
// `times` times; "" when every step held.
std::string AttachStoreDetach(const std::string& sock, int times) {
  for (int round = 0; round < times; ++round) {
    auto engine = hostengine::HostEngine::Create({2, 2, 64, 2, 16, tutti::v1::KV_FORMAT_SEPARATE},
                                                 8, absl::StrCat("tutti-mu-h", round));
    if (!engine.ok()) return std::string(engine.status().message());
    auto channel = ConnectToTuttid(sock, absl::Seconds(5));
    if (!channel.ok()) return std::string(channel.status().message());
    hostengine::EngineClient client(*channel, sock, absl::Seconds(30));
    auto attach = client.Attach((*engine)->MakeAttachRequest({}), (*engine)->fds());
    (*engine)->region().Unlink();
    if (!attach.ok()) {
      return absl::StrCat("attach ", round + 1, " of ", times, ": ", attach.status().message());
    }
    std::vector<Key> keys;
    for (uint64_t i = 0; i < 4; ++i) {
      Key k;
      k.bytes[0] = static_cast<uint8_t>(i + 1);
      keys.push_back(k);
      (*engine)->FillBlock(i, k);
    }
    const std::vector<uint32_t> blocks = {0, 1, 2, 3};
    auto stored = client.Store(keys, blocks, /*wait_durable=*/true);
    if (!stored.ok()) return "store: " + std::string(stored.status().message());
    auto lookup = client.Lookup(keys);
    if (!lookup.ok() || lookup->hits() != 4) return std::string("lookup missed");
    if (absl::Status s = client.Release(lookup->lease_id()); !s.ok()) return s.ToString();
    if (absl::Status s = client.Detach(); !s.ok()) return "detach: " + s.ToString();
  }
  return "";
}

// The attack: a member of the socket's group holds 200 idle connections to the handoff
// socket and re-opens each one as soon as tuttid answers or drops it. The engine user still
// attaches 5 times of 5, and the hostile user is told which limit it hit.
TEST_F(MultiUserTest, OneUsersIdleHandoffConnectionsDoNotStopAnotherEnginesAttach) {
  const std::string handoff = HandoffPath(socket_);
  Background hostile(
      {kHostileUid, kHostileGid, {kTuttiGid}},
      [&](int stop) {
        std::vector<int> conns;
        for (int i = 0; i < 200; ++i) conns.push_back(ConnectSeqpacket(handoff));
        uint64_t reopened = 0;
        for (;;) {
          std::vector<pollfd> polls = {{stop, POLLIN, 0}};
          for (int fd : conns) polls.push_back({fd, POLLIN, 0});
          if (poll(polls.data(), polls.size(), 100) < 0 && errno != EINTR) return std::string("poll failed");
          if (polls[0].revents != 0) break;
          for (size_t i = 0; i < conns.size(); ++i) {
            if (polls[i + 1].revents == 0 && conns[i] >= 0) continue;
            if (conns[i] >= 0) close(conns[i]);
            conns[i] = ConnectSeqpacket(handoff);
            ++reopened;
          }
        }
        for (int fd : conns) close(fd);
        return Expect(reopened > 0, "tuttid never answered or dropped a connection");
      },
      [&](int report) {
        // Ready once 200 are open: the first 16 wait for their request, the others are told why.
        std::vector<int> held;
        for (int i = 0; i < 200; ++i) held.push_back(ConnectSeqpacket(handoff));
        std::string why = AnswerOf(held.back());
        for (int fd : held) close(fd);
        why.erase(std::remove(why.begin(), why.end(), '\n'), why.end());
        (void)!write(report, (why + "\n").data(), why.size() + 1);
      });
  EXPECT_NE(hostile.ready().find(absl::StrCat("user ", kHostileUid,
                                              " has 16 handoff connections "
                                              "open (limits.max_handoff_connections_per_user)")),
            std::string::npos)
      << hostile.ready();
  const std::string sock = socket_;
  EXPECT_EQ(
      RunAs({kEngineUid, kEngineGid, {kTuttiGid}}, [&] { return AttachStoreDetach(sock, 5); }), "");
  EXPECT_EQ(hostile.Finish(), "");
}

// Metrics on (a free port, read from the log): the endpoint every local user can reach.
class MetricsEndpointTest : public MultiUserTest {
 protected:
  std::string MetricsBlock() override { return "metrics { listen: \"127.0.0.1:0\" }"; }
  int MetricsPort() {
    const std::string log = FileTail(log_, 1 << 20);
    const std::string head = "metrics on http://127.0.0.1:";
    const size_t at = log.find(head);
    return at == std::string::npos ? 0 : std::atoi(log.c_str() + at + head.size());
  }
};

TEST_F(MetricsEndpointTest, AStrangerLearnsNoModelsOrNamespacesByDefault) {
  const int port = MetricsPort();
  ASSERT_GT(port, 0) << FileTail(log_, 4000);
  const std::string sock = socket_;
  ASSERT_EQ(
      RunAs({kEngineUid, kEngineGid, {kTuttiGid}}, [&] { return AttachStoreDetach(sock, 1); }), "");
  EXPECT_EQ(RunAs({kStrangerUid, kStrangerGid, {}},
                  [&] {
                    auto page = metrics::HttpGet(port, "/metrics");
                    if (!page.ok()) return "scrape: " + page.status().ToString();
                    std::string r;
                    r += Expect(page->find("\ntutti_lookup_hits_total 4\n") != std::string::npos,
                                "the totals are missing");
                    for (const char* secret : {"model=", "namespace=", "bench-llama3-8b"}) {
                      r += Expect(page->find(secret) == std::string::npos,
                                  absl::StrCat("the page shows ", secret));
                    }
                    return r;
                  }),
            "");
}

// More clients stalled mid-request than the endpoint has serving threads (16): a scrape is
// served once their request timeout frees the threads.
TEST_F(MetricsEndpointTest, AStrangersStalledRequestsDoNotStopAScrape) {
  const int port = MetricsPort();
  ASSERT_GT(port, 0) << FileTail(log_, 4000);
  EXPECT_EQ(RunAs({kStrangerUid, kStrangerGid, {}},
                  [&] {
                    std::vector<UniqueFd> stalled;
                    for (int i = 0; i < 32; ++i) {
                      auto fd = metrics::OpenHalfSentRequest(port);
                      if (!fd.ok()) return fd.status().ToString();
                      stalled.push_back(std::move(*fd));
                    }
                    auto page = metrics::HttpGet(port, "/metrics", /*timeout_ms=*/30000);
                    if (!page.ok()) return "scrape: " + page.status().ToString();
                    return Expect(page->find("tutti_lookups_total") != std::string::npos,
                                  "not a metrics page");
                  }),
            "");
}


}  // namespace
}  // namespace tutti::testing
