// Namespaces belong to their user (docs/security.md "Namespaces"): another uid naming the same
// model gets a namespace of its own (no hits, no events) unless both give one namespace_secret or
// the operator shares by host; a user's namespaces are bounded; the operator removes one. Other
// users are credentials issued here for their uid (the handoff socket's peer in production).
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/server/kvcache_service.h"
#include "daemon/server/service_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

using ::testing::HasSubstr;
using tutti::v1::AttachResponse;
using tutti::v1::WatchEventsResponse;

constexpr uint32_t kOtherUid = 4242;
const std::string kSecret(24, 's');

class NamespaceScopeTest : public ::testing::Test {
 protected:
  explicit NamespaceScopeTest(EnvOptions options = {}) : env_(EnoughSessions(options)) {}
  static EnvOptions EnoughSessions(EnvOptions o) {
    o.max_sessions = 16;
    return o;
  }

  // Attaches `engine_` (this process's uid) with `secret`; stores `keys` durably.
  AttachResponse AttachOwner(const std::string& secret = "") {
    tutti::v1::AttachRequest req = env_.AttachRequest(engine_);
    req.set_namespace_secret(secret);
    grpc::ClientContext ctx;
    AttachResponse resp;
    const grpc::Status s = env_.kv().Attach(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    env_.Remember(resp);
    return resp;
  }

  // A memory-less Attach of `model` by user `uid`.
  grpc::Status AttachAs(uint32_t uid, const std::string& secret, AttachResponse* resp,
                        const std::string& model = TestNamespace().model_id()) {
    tutti::v1::AttachRequest req;
    req.set_engine_id("other-user");
    *req.mutable_namespace_() = TestNamespace();
    req.mutable_namespace_()->set_model_id(model);
    req.set_namespace_secret(secret);
    absl::StatusOr<std::string> credential = env_.credentials().Issue(Peer{getpid(), uid, uid}, {});
    EXPECT_TRUE(credential.ok()) << credential.status();
    if (credential.ok()) req.set_credential(*credential);
    grpc::ClientContext ctx;
    const grpc::Status s = env_.kv().Attach(&ctx, req, resp);
    if (s.ok()) env_.Remember(*resp);
    return s;
  }

  void Store(uint64_t session, uint64_t key) {
    engine_.Fill(0, key);
    tutti::v1::StoreRequest req;
    env_.Name(session, &req);
    auto* b = req.add_blocks();
    b->set_key(KeyBytes(key));
    b->set_engine_block(0);
    req.set_wait_durable(true);
    grpc::ClientContext ctx;
    tutti::v1::StoreResponse resp;
    ASSERT_TRUE(env_.kv().Store(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.outcomes(0), tutti::v1::STORE_DURABLE);
  }

  uint32_t Hits(uint64_t session, const std::vector<uint64_t>& keys) {
    tutti::v1::LookupRequest req;
    env_.Name(session, &req);
    for (uint64_t k : keys) req.add_keys(KeyBytes(k));
    grpc::ClientContext ctx;
    tutti::v1::LookupResponse resp;
    const grpc::Status s = env_.kv().Lookup(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (resp.lease_id() != 0) {
      tutti::v1::ReleaseRequest rel;
      env_.Name(session, &rel);
      rel.set_lease_id(resp.lease_id());
      grpc::ClientContext c2;
      tutti::v1::ReleaseResponse rr;
      EXPECT_TRUE(env_.kv().Release(&c2, rel, &rr).ok());
    }
    return resp.hits();
  }

  // The first message of a WatchEvents resuming after seq 1 of this run.
  WatchEventsResponse History(uint64_t session) {
    tutti::v1::WatchEventsRequest req;
    env_.Name(session, &req);
    req.set_after_seq(1);
    req.set_boot_id(env_.store().events().boot_id());
    grpc::ClientContext ctx;
    auto reader = env_.kv().WatchEvents(&ctx, req);
    WatchEventsResponse first;
    EXPECT_TRUE(reader->Read(&first));
    ctx.TryCancel();
    return first;
  }

  void Detach(uint64_t session) {
    tutti::v1::DetachRequest req;
    env_.Name(session, &req);
    grpc::ClientContext ctx;
    tutti::v1::DetachResponse resp;
    ASSERT_TRUE(env_.kv().Detach(&ctx, req, &resp).ok());
  }

  ServiceEnv env_;
  ShmEngine engine_;
};

TEST_F(NamespaceScopeTest, AnotherUserNamingTheModelGetsNoHitsAndNoEvents) {
  const AttachResponse owner = AttachOwner();
  for (uint64_t k : {1, 2, 3}) Store(owner.session_id(), k);
  AttachResponse other;
  ASSERT_TRUE(AttachAs(kOtherUid, "", &other).ok());
  EXPECT_NE(other.namespace_id(), owner.namespace_id());
  EXPECT_EQ(Hits(other.session_id(), {1, 2, 3}), 0u);
  const WatchEventsResponse history = History(other.session_id());
  EXPECT_FALSE(history.resumed());
  EXPECT_EQ(history.events_size(), 0);
  // The owner's own second engine shares it: its blocks and its history.
  AttachResponse same_user;
  ASSERT_TRUE(AttachAs(getuid(), "", &same_user).ok());
  EXPECT_EQ(same_user.namespace_id(), owner.namespace_id());
  EXPECT_EQ(Hits(same_user.session_id(), {1, 2, 3}), 3u);
  EXPECT_EQ(History(same_user.session_id()).events_size(), 2);
}

TEST_F(NamespaceScopeTest, EnginesGivingOneSecretShareAcrossUsersAndNoOneElse) {
  const AttachResponse owner = AttachOwner(kSecret);
  for (uint64_t k : {1, 2, 3}) Store(owner.session_id(), k);
  AttachResponse friend_;
  ASSERT_TRUE(AttachAs(kOtherUid, kSecret, &friend_).ok());
  EXPECT_EQ(friend_.namespace_id(), owner.namespace_id());
  EXPECT_EQ(Hits(friend_.session_id(), {1, 2, 3}), 3u);
  EXPECT_EQ(History(friend_.session_id()).events_size(), 2);
  AttachResponse other_secret, no_secret, owner_no_secret;
  ASSERT_TRUE(AttachAs(kOtherUid, std::string(24, 't'), &other_secret).ok());
  ASSERT_TRUE(AttachAs(kOtherUid, "", &no_secret).ok());
  ASSERT_TRUE(AttachAs(getuid(), "", &owner_no_secret).ok());
  for (const AttachResponse* r : {&other_secret, &no_secret, &owner_no_secret}) {
    EXPECT_NE(r->namespace_id(), owner.namespace_id());
    EXPECT_EQ(Hits(r->session_id(), {1, 2, 3}), 0u);
  }
}

TEST_F(NamespaceScopeTest, ASecretOfTheWrongLengthIsRefusedNamingTheField) {
  AttachResponse resp;
  for (size_t n : {15, 65}) {
    const grpc::Status s = AttachAs(kOtherUid, std::string(n, 'x'), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("namespace_secret"));
  }
  EXPECT_TRUE(env_.store().Stats().namespaces.empty());
}

TEST_F(NamespaceScopeTest, StatsNameTheOwnerAndTheSessions) {
  const AttachResponse owner = AttachOwner();
  AttachResponse shared;
  ASSERT_TRUE(AttachAs(kOtherUid, kSecret, &shared).ok());
  grpc::ClientContext ctx;
  tutti::v1::StatsResponse stats;
  ASSERT_TRUE(env_.admin().Stats(&ctx, {}, &stats).ok());
  ASSERT_EQ(stats.namespaces_size(), 2);
  for (const auto& row : stats.namespaces()) {
    EXPECT_EQ(row.sessions(), 1u);
    if (row.namespace_id() == owner.namespace_id()) {
      EXPECT_EQ(row.owner_uid(), getuid());
      EXPECT_FALSE(row.shared());
    } else {
      EXPECT_EQ(row.owner_uid(), kOtherUid);
      EXPECT_TRUE(row.shared());
    }
  }
}

TEST_F(NamespaceScopeTest, RemoveNamespaceWaitsForSessionsUnlessForced) {
  const AttachResponse owner = AttachOwner();
  for (uint64_t k : {1, 2, 3}) Store(owner.session_id(), k);
  auto remove = [&](bool force, tutti::v1::RemoveNamespaceResponse* resp) {
    tutti::v1::RemoveNamespaceRequest req;
    req.set_namespace_id(owner.namespace_id());
    req.set_force(force);
    grpc::ClientContext ctx;
    return env_.admin().RemoveNamespace(&ctx, req, resp);
  };
  tutti::v1::RemoveNamespaceResponse resp;
  grpc::Status s = remove(false, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("1 sessions attached"));
  s = remove(true, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.sessions_closed(), 1u);
  EXPECT_EQ(resp.evicted(), 3u);
  EXPECT_TRUE(env_.store().Stats().namespaces.empty());
  EXPECT_EQ(remove(false, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  // Attached again, it starts empty.
  const AttachResponse again = AttachOwner();
  EXPECT_EQ(again.namespace_id(), owner.namespace_id());
  EXPECT_EQ(Hits(again.session_id(), {1}), 0u);
}

class HostSharingTest : public NamespaceScopeTest {
 protected:
  static EnvOptions Host() {
    EnvOptions o;
    o.namespace_sharing = "host";
    return o;
  }
  HostSharingTest() : NamespaceScopeTest(Host()) {}
};

TEST_F(HostSharingTest, EveryUserSharesTheModelsNamespace) {
  const AttachResponse owner = AttachOwner();
  for (uint64_t k : {1, 2, 3}) Store(owner.session_id(), k);
  AttachResponse other;
  ASSERT_TRUE(AttachAs(kOtherUid, "", &other).ok());
  EXPECT_EQ(other.namespace_id(), owner.namespace_id());
  EXPECT_EQ(Hits(other.session_id(), {1, 2, 3}), 3u);
  EXPECT_EQ(History(other.session_id()).events_size(), 2);
  // The id is the one namespaces had before they had owners: journaled blocks stay reachable.
  EXPECT_EQ(owner.namespace_id(), *env_.store().RegisterNamespace(TestNamespace()));
}

class NamespaceBoundTest : public NamespaceScopeTest {
 protected:
  static EnvOptions TwoPerUser() {
    EnvOptions o;
    o.max_namespaces_per_user = 2;
    o.max_namespaces = 5;
    return o;
  }
  NamespaceBoundTest() : NamespaceScopeTest(TwoPerUser()) {}
};

TEST_F(NamespaceBoundTest, OneUserAtItsBoundLeavesRoomForOthersAndItsEmptyOnesAreDropped) {
  AttachResponse a, b, c;
  ASSERT_TRUE(AttachAs(kOtherUid, "", &a, "model-a").ok());
  ASSERT_TRUE(AttachAs(kOtherUid, "", &b, "model-b").ok());
  grpc::Status s = AttachAs(kOtherUid, "", &c, "model-c");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_namespaces_per_user"));
  // Another user still attaches a new model.
  AttachResponse mine;
  ASSERT_TRUE(AttachAs(getuid(), "", &mine, "model-a").ok());
  // Once model-a's session is gone (it holds no blocks), model-c takes its place.
  Detach(a.session_id());
  ASSERT_TRUE(AttachAs(kOtherUid, "", &c, "model-c").ok());
  std::vector<NamespaceId> kept;
  for (const auto& ns : env_.store().Stats().namespaces) kept.push_back(ns.id);
  EXPECT_THAT(kept, ::testing::UnorderedElementsAre(b.namespace_id(), c.namespace_id(),
                                                    mine.namespace_id()));
}

}  // namespace
}  // namespace tutti::server::testing
