#include "daemon/server/sessions.h"

#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server {
namespace {

// Counts pins per key, as the store would.
class FakePins {
 public:
  void Pin(absl::Span<const Key> keys) {
    absl::MutexLock lock(&mu_);
    for (const Key& k : keys) ++pins_[k.lo()];
  }
  void Unpin(NamespaceId ns, absl::Span<const Key> keys) {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(ns, 7u);
    for (const Key& k : keys) {
      EXPECT_GT(pins_[k.lo()], 0) << "unpinned more often than pinned";
      --pins_[k.lo()];
    }
  }
  int Total() {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& [k, c] : pins_) n += c;
    return n;
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, int> pins_;
};

class FakeIo : public engine::EngineIo {
 public:
  ~FakeIo() override { ++destroyed; }
  std::string_view kind() const override { return "fake"; }
  uint32_t num_blocks() const override { return 16; }
  bool is_device() const override { return false; }
  bool has_ready_words() const override { return false; }
  absl::Status ScatterLayer(uint32_t, absl::Span<const engine::CopyOp>, uint32_t) override {
    return absl::OkStatus();
  }
  absl::Status SignalLayers(uint32_t, uint32_t, uint32_t) override { return absl::OkStatus(); }
  absl::Status Gather(absl::Span<const engine::CopyOp>) override { return absl::OkStatus(); }
  absl::Status SignalCaptured(uint32_t) override { return absl::OkStatus(); }
  void Close() override { ++closes; }
  int closes = 0;
  static inline int destroyed = 0;
};

Key K(uint64_t v) {
  Key k;
  std::memcpy(k.bytes.data(), &v, 8);
  return k;
}

class SessionsTest : public ::testing::Test {
 protected:
  SessionsTest()
      : sessions_(SessionManager::Options{1000, 500, 2}, &clock_,
                  [this](NamespaceId ns, absl::Span<const Key> keys) { pins_.Unpin(ns, keys); }) {}

  uint64_t OpenSession() {
    auto s = sessions_.Open("engine", 7, "model", std::make_shared<FakeIo>());
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return 0;
    tokens_[(*s)->id] = (*s)->token;
    return (*s)->id;
  }
  // Touches `session` as its engine does, with its token.
  absl::StatusOr<SessionRef> Touch(uint64_t session) {
    return sessions_.Touch(session, tokens_[session]);
  }
  uint64_t Lease(uint64_t session, std::vector<Key> keys) {
    pins_.Pin(keys);
    auto id = sessions_.AddLease(session, std::move(keys));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }

  ManualClock clock_{1000};
  FakePins pins_;
  SessionManager sessions_;
  std::map<uint64_t, std::string> tokens_;
};

TEST_F(SessionsTest, OpenTouchCloseAndUnknownIds) {
  const uint64_t id = OpenSession();
  EXPECT_EQ(sessions_.num_sessions(), 1u);
  ASSERT_TRUE(Touch(id).ok());
  EXPECT_EQ((*Touch(id))->ns, 7u);
  EXPECT_EQ(Touch(id + 100).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(sessions_.Close(id).ok());
  EXPECT_EQ(sessions_.Close(id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Touch(id).status().code(), absl::StatusCode::kNotFound);
}

// Issue 19: ids count 1, 2, 3; a caller that guessed one acted in another engine's session. Only
// the token Open drew (16 random bytes, distinct per session) lets a caller in, and any other
// token is answered exactly as an unknown id.
TEST_F(SessionsTest, OnlyTheSessionsTokenEntersItAndAWrongOneLooksUnknown) {
  const uint64_t a = OpenSession(), b = OpenSession();
  ASSERT_EQ(tokens_[a].size(), kSessionTokenBytes);
  EXPECT_NE(tokens_[a], tokens_[b]);
  EXPECT_NE(tokens_[a], std::string(kSessionTokenBytes, '\0'));
  ASSERT_TRUE(Touch(a).ok());
  const absl::Status unknown = sessions_.Touch(a + 100, tokens_[a]).status();
  ASSERT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  std::string flipped = tokens_[a];
  flipped[15] ^= 1;
  for (const std::string& wrong :
       {std::string(), tokens_[b], flipped, tokens_[a].substr(0, 15), tokens_[a] + "x"}) {
    const absl::Status s = sessions_.Touch(a, wrong).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    // The same words as for an unknown id, but for the id itself.
    EXPECT_EQ(s.message(), absl::StrCat("session ", a, " is unknown or expired"));
  }
  EXPECT_EQ(unknown.message(), absl::StrCat("session ", a + 100, " is unknown or expired"));
}

TEST_F(SessionsTest, MaxSessionsIsResourceExhausted) {
  OpenSession();
  const uint64_t second = OpenSession();
  auto third = sessions_.Open("x", 7, "m", std::make_shared<FakeIo>());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(sessions_.Close(second).ok());
  EXPECT_TRUE(sessions_.Open("x", 7, "m", std::make_shared<FakeIo>()).ok());
}

TEST_F(SessionsTest, ReleaseUnpinsOnceAndOnlyTheOwnerMayRelease) {
  const uint64_t a = OpenSession(), b = OpenSession();
  const uint64_t lease = Lease(a, {K(1), K(2)});
  EXPECT_NE(lease, 0u);
  EXPECT_EQ(pins_.Total(), 2);
  EXPECT_EQ(sessions_.Release(b, lease).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pins_.Total(), 2);
  ASSERT_TRUE(sessions_.Release(a, lease).ok());
  EXPECT_EQ(pins_.Total(), 0);
  EXPECT_EQ(sessions_.Release(a, lease).code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionsTest, ClaimChecksKeysAndUnpinsWhenTheRetrieveEnds) {
  const uint64_t a = OpenSession();
  const uint64_t lease = Lease(a, {K(1), K(2), K(3)});
  std::vector<Key> wrong = {K(1), K(9)};
  auto bad = sessions_.ClaimLeases(a, {lease}, wrong);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("blocks[1]"));
  std::vector<Key> some = {K(3), K(1)};
  {
    auto claimed = sessions_.ClaimLeases(a, {lease}, some);
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    // Claimed leases neither expire nor can be released or claimed twice.
    clock_.AdvanceMs(600);
    ASSERT_TRUE(Touch(a).ok());
    EXPECT_EQ(sessions_.Reap().second, 0u);
    EXPECT_EQ(pins_.Total(), 3);
    EXPECT_EQ(sessions_.Release(a, lease).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(sessions_.ClaimLeases(a, {lease}, some).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(pins_.Total(), 0);  // every key of the lease, claimed or not
}

TEST_F(SessionsTest, LeasesExpireAfterTheirTtl) {
  const uint64_t a = OpenSession();
  Lease(a, {K(1)});
  clock_.AdvanceMs(400);
  const uint64_t later = Lease(a, {K(2)});
  clock_.AdvanceMs(100);  // the first is 500 ms old now
  EXPECT_EQ(sessions_.Reap(), std::make_pair(0u, 1u));
  EXPECT_EQ(pins_.Total(), 1);
  clock_.AdvanceMs(400);
  EXPECT_EQ(sessions_.Reap(), std::make_pair(0u, 1u));
  EXPECT_EQ(pins_.Total(), 0);
  EXPECT_EQ(sessions_.Release(a, later).code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionsTest, IdleSessionsExpireWithTheirLeasesAndTouchKeepsThemAlive) {
  const uint64_t idle = OpenSession(), busy = OpenSession();
  Lease(idle, {K(1), K(2)});
  for (int i = 0; i < 4; ++i) {
    clock_.AdvanceMs(400);
    ASSERT_TRUE(Touch(busy).ok());
    sessions_.Reap();
  }
  EXPECT_EQ(Touch(idle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Touch(busy).ok());
  EXPECT_EQ(pins_.Total(), 0);
  EXPECT_EQ(sessions_.num_sessions(), 1u);
}

TEST_F(SessionsTest, CloseClosesTheIoAtOnceAndStateStaysWhileARequestHoldsIt) {
  FakeIo::destroyed = 0;
  auto io = std::make_shared<FakeIo>();
  FakeIo* raw = io.get();
  auto opened = sessions_.Open("engine", 7, "model", std::move(io), 4242);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->engine_pid, 4242u);
  const uint64_t a = (*opened)->id;
  tokens_[a] = (*opened)->token;
  opened->reset();
  SessionRef in_flight = *Touch(a);
  ASSERT_TRUE(sessions_.Close(a, "engine process 4242 exited").ok());
  EXPECT_TRUE(in_flight->closed.load());
  EXPECT_EQ(raw->closes, 1);  // mappings released now, not when the request ends
  EXPECT_EQ(FakeIo::destroyed, 0);
  in_flight.reset();
  EXPECT_EQ(FakeIo::destroyed, 1);
  EXPECT_EQ(sessions_.Close(a).code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionsTest, ExpiryAndDestructionCloseTheIoOnce) {
  auto io = std::make_shared<FakeIo>();
  auto opened = sessions_.Open("engine", 7, "model", io);
  ASSERT_TRUE(opened.ok());
  clock_.AdvanceMs(5000);
  sessions_.Reap();
  EXPECT_EQ(io->closes, 1);
  auto io2 = std::make_shared<FakeIo>();
  {
    SessionManager m(SessionManager::Options{1000, 500, 4}, &clock_,
                     [](NamespaceId, absl::Span<const Key>) {});
    ASSERT_TRUE(m.Open("e", 7, "m", io2).ok());
  }
  EXPECT_EQ(io2->closes, 1);
}

TEST_F(SessionsTest, AddLeaseToAGoneSessionLeavesPinsToTheCaller) {
  auto id = sessions_.AddLease(12345, {K(1)});
  EXPECT_EQ(id.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionsTest, ListReportsLeasesAndIdleTime) {
  const uint64_t a = OpenSession();
  Lease(a, {K(1), K(2)});
  Lease(a, {K(3)});
  clock_.AdvanceMs(250);
  auto rows = sessions_.List();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].id, a);
  EXPECT_EQ(rows[0].leases, 2u);
  EXPECT_EQ(rows[0].pinned_blocks, 3u);
  EXPECT_EQ(rows[0].idle_ms, 250u);
  EXPECT_EQ(rows[0].num_blocks, 16u);
}

TEST_F(SessionsTest, DestructorUnpinsEverything) {
  FakePins pins;
  {
    SessionManager m(SessionManager::Options{1000, 500, 4}, &clock_,
                     [&pins](NamespaceId ns, absl::Span<const Key> keys) { pins.Unpin(ns, keys); });
    auto s = m.Open("e", 7, "m", std::make_shared<FakeIo>());
    pins.Pin(std::vector<Key>{K(1), K(2)});
    ASSERT_TRUE(m.AddLease((*s)->id, {K(1), K(2)}).ok());
  }
  EXPECT_EQ(pins.Total(), 0);
}

TEST(ReaperTest, ReapsPeriodically) {
  ManualClock clock(0);
  int unpinned = 0;
  SessionManager m(
      SessionManager::Options{1000, 100, 4}, &clock,
      [&unpinned](NamespaceId, absl::Span<const Key> keys) { unpinned += keys.size(); });
  auto s = m.Open("e", 7, "m", std::make_shared<FakeIo>());
  ASSERT_TRUE(m.AddLease((*s)->id, {K(1)}).ok());
  clock.AdvanceMs(5000);
  {
    Reaper reaper(&m, 5);
    for (int i = 0; i < 400 && m.num_sessions() > 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(m.num_sessions(), 0u);
  EXPECT_EQ(unpinned, 1);
}

}  // namespace
}  // namespace tutti::server

namespace tutti::server {
namespace {

// Issue 9: one client's Lookups took 51,216 leases (22.9 million pins) and starved the rest; one
// client took every session. Each bound answers RESOURCE_EXHAUSTED naming its limit, and the
// counts come back as leases end (release, claim, expiry, close).
class SessionLimitsTest : public ::testing::Test {
 protected:
  static SessionManager::Options Limits() {
    SessionManager::Options o;
    o.session_ttl_ms = 1000;
    o.lease_ttl_ms = 500;
    o.max_sessions = 8;
    o.max_sessions_per_user = 2;
    o.max_leases_per_session = 3;
    o.max_pinned_blocks_per_session = 10;
    o.max_pinned_blocks = 15;
    return o;
  }
  uint64_t Open(uint32_t uid) {
    auto s = sessions_.Open("e", 7, "m", std::make_shared<FakeIo>(), 0, uid);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? (*s)->id : 0;
  }
  absl::StatusOr<uint64_t> Lease(uint64_t session, uint64_t first, uint64_t n) {
    std::vector<Key> keys;
    for (uint64_t i = 0; i < n; ++i) keys.push_back(K(first + i));
    pins_.Pin(keys);
    absl::StatusOr<uint64_t> id = sessions_.AddLease(session, keys);
    if (!id.ok()) pins_.Unpin(7, keys);  // the caller keeps the pins on error
    return id;
  }
  static void ExpectLimit(const absl::Status& s, const std::string& limit) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(limit));
  }

  ManualClock clock_{1000};
  FakePins pins_;
  SessionManager sessions_{Limits(), &clock_, [this](NamespaceId ns, absl::Span<const Key> keys) {
                             pins_.Unpin(ns, keys);
                           }};
};

TEST_F(SessionLimitsTest, SessionsPerUser) {
  Open(1000);
  const uint64_t second = Open(1000);
  ExpectLimit(sessions_.Open("e", 7, "m", std::make_shared<FakeIo>(), 0, 1000).status(),
              "limits.max_sessions_per_user");
  EXPECT_TRUE(sessions_.Open("e", 7, "m", std::make_shared<FakeIo>(), 0, 1001).ok())
      << "another user still attaches";
  ASSERT_TRUE(sessions_.Close(second).ok());
  EXPECT_TRUE(sessions_.Open("e", 7, "m", std::make_shared<FakeIo>(), 0, 1000).ok());
}

TEST_F(SessionLimitsTest, LeasesAndPinsPerSessionAndInAll) {
  const uint64_t a = Open(1), b = Open(2);
  ASSERT_TRUE(Lease(a, 0, 1).ok());
  ASSERT_TRUE(Lease(a, 10, 1).ok());
  auto third = Lease(a, 20, 1);
  ASSERT_TRUE(third.ok());
  ExpectLimit(Lease(a, 30, 1).status(), "limits.max_leases_per_session");
  ASSERT_TRUE(sessions_.Release(a, *third).ok());
  ExpectLimit(Lease(a, 30, 9).status(), "limits.max_pinned_blocks_per_session");
  ASSERT_TRUE(Lease(a, 30, 8).ok());  // 10 pinned: at the session's bound
  // b may pin only what is left of everyone's 15.
  ExpectLimit(Lease(b, 100, 6).status(), "limits.max_pinned_blocks");
  auto b_lease = Lease(b, 100, 5);
  ASSERT_TRUE(b_lease.ok());
  // A claimed lease still holds its pins in all, and frees them when it ends.
  {
    std::vector<Key> keys;
    for (uint64_t i = 0; i < 5; ++i) keys.push_back(K(100 + i));
    auto claimed = sessions_.ClaimLeases(b, {*b_lease}, keys);
    ASSERT_TRUE(claimed.ok());
    ExpectLimit(Lease(b, 200, 1).status(), "limits.max_pinned_blocks");
  }
  EXPECT_TRUE(Lease(b, 200, 5).ok());
  // Expiry and close give everything back.
  clock_.AdvanceMs(600);
  sessions_.Reap();
  EXPECT_EQ(pins_.Total(), 0);
  EXPECT_TRUE(Lease(b, 300, 10).ok());
  ASSERT_TRUE(sessions_.Close(b).ok());
  EXPECT_TRUE(Lease(a, 400, 10).ok());
}

// Issue 12: a Retrieve of one session under leases of another session of the same engine (vLLM's
// scheduler looks up in a memory-less session, its worker retrieves).
class LeaseSharingTest : public ::testing::Test {
 protected:
  static constexpr char kGroup[] = "0123456789abcdef";
  static SessionManager::Options Limits() {
    SessionManager::Options o;
    o.session_ttl_ms = 1000;
    o.lease_ttl_ms = 500;
    o.max_sessions = 8;
    o.max_pinned_blocks_per_session = 10;
    return o;
  }
  uint64_t Open(std::string group, NamespaceId ns = 7, uint32_t uid = 1000) {
    auto s = sessions_.Open("e", ns, "m", std::make_shared<FakeIo>(), 0, uid, std::move(group));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? (*s)->id : 0;
  }
  uint64_t Lease(uint64_t session, std::vector<Key> keys) {
    pins_.Pin(keys);
    auto id = sessions_.AddLease(session, std::move(keys));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  absl::Status Claim(uint64_t session, std::vector<uint64_t> leases, std::vector<Key> keys) {
    return sessions_.ClaimLeases(session, leases, keys).status();
  }
  static std::string Unknown(uint64_t lease, uint64_t session) {
    return absl::StrCat("lease ", lease, " is not held by session ", session,
                        " (unknown, released or expired)");
  }

  ManualClock clock_{1000};
  FakePins pins_;
  SessionManager sessions_{Limits(), &clock_, [this](NamespaceId ns, absl::Span<const Key> keys) {
                             pins_.Unpin(ns, keys);
                           }};
};

TEST_F(LeaseSharingTest, AWorkerRetrievesUnderItsSchedulersLease) {
  const uint64_t scheduler = Open(kGroup), worker = Open(kGroup);
  const uint64_t lease = Lease(scheduler, {K(1), K(2), K(3)});
  {
    auto claimed = sessions_.ClaimLeases(worker, {lease}, {K(2), K(1)});
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    EXPECT_EQ(pins_.Total(), 3);
    EXPECT_EQ(sessions_.Release(scheduler, lease).code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(pins_.Total(), 0);  // the lease ended with the Retrieve
  EXPECT_EQ(Claim(worker, {lease}, {K(1)}).code(), absl::StatusCode::kNotFound);
}

TEST_F(LeaseSharingTest, OtherGroupsNoGroupNamespacesAndUsersSeeNotFound) {
  const uint64_t scheduler = Open(kGroup);
  const uint64_t lease = Lease(scheduler, {K(1)});
  const uint64_t other_group = Open("fedcba9876543210");
  const uint64_t other_ns = Open(kGroup, 8);
  const uint64_t other_uid = Open(kGroup, 7, 1001);
  for (uint64_t thief : {other_group, other_ns, other_uid}) {
    const absl::Status s = Claim(thief, {lease}, {K(1)});
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << thief;
    EXPECT_EQ(s.message(), Unknown(lease, thief)) << "exactly as an unknown lease";
  }
  // Without a group nothing is shared, even between sessions alike in all else.
  const uint64_t plain = Open(""), plain_too = Open("");
  const uint64_t plain_lease = Lease(plain, {K(2)});
  EXPECT_EQ(Claim(plain_too, {plain_lease}, {K(2)}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pins_.Total(), 2);  // nothing was taken
  EXPECT_TRUE(sessions_.Release(scheduler, lease).ok());
  EXPECT_TRUE(sessions_.Release(plain, plain_lease).ok());
  EXPECT_EQ(pins_.Total(), 0);
}

TEST_F(LeaseSharingTest, SeveralLeasesAreClaimedAllOrNothing) {
  const uint64_t scheduler = Open(kGroup), worker = Open(kGroup);
  const uint64_t a = Lease(scheduler, {K(1), K(2)});
  const uint64_t b = Lease(scheduler, {K(1), K(2), K(3)});  // a second request, same prefix
  const uint64_t own = Lease(worker, {K(4)});
  // One unknown lease: none is taken.
  EXPECT_EQ(Claim(worker, {a, b, 999}, {K(1)}).code(), absl::StatusCode::kNotFound);
  // A key under none of them: none is taken either.
  const absl::Status missing = Claim(worker, {a, b, own}, {K(1), K(5)});
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(missing.message()), ::testing::HasSubstr("blocks[1]"));
  EXPECT_EQ(Claim(worker, {a, a}, {K(1)}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pins_.Total(), 6);
  {
    auto claimed = sessions_.ClaimLeases(worker, {a, b, own}, {K(3), K(4), K(1)});
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    EXPECT_EQ(pins_.Total(), 6);
  }
  EXPECT_EQ(pins_.Total(), 0);  // each lease unpinned its own keys once
  // After a refused claim, the good leases are still releasable.
  const uint64_t c = Lease(scheduler, {K(7)});
  EXPECT_EQ(Claim(worker, {c, 12345}, {K(7)}).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(sessions_.Release(scheduler, c).ok());
  EXPECT_EQ(pins_.Total(), 0);
}

TEST_F(LeaseSharingTest, ClaimedPinsCountAgainstTheOwnerUntilTheyEnd) {
  const uint64_t scheduler = Open(kGroup), worker = Open(kGroup);
  std::vector<Key> ten;
  for (uint64_t i = 0; i < 10; ++i) ten.push_back(K(i));
  const uint64_t lease = Lease(scheduler, ten);
  {
    auto claimed = sessions_.ClaimLeases(worker, {lease}, {K(0)});
    ASSERT_TRUE(claimed.ok());
    pins_.Pin({K(50)});
    auto more = sessions_.AddLease(scheduler, {K(50)});
    EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(more.status().message()),
                ::testing::HasSubstr("limits.max_pinned_blocks_per_session"));
    pins_.Unpin(7, {K(50)});
    EXPECT_EQ(sessions_.List()[0].pinned_blocks, 10u);
    EXPECT_EQ(sessions_.List()[1].pinned_blocks, 0u);
  }
  EXPECT_EQ(sessions_.List()[0].pinned_blocks, 0u);
  pins_.Pin({K(50)});
  EXPECT_TRUE(sessions_.AddLease(scheduler, {K(50)}).ok());
}

// The scheduler detaches (or dies) while its worker's Retrieve holds the claim: the pins stay
// until the Retrieve ends and are dropped once (FakePins fails on a second unpin).
TEST_F(LeaseSharingTest, TheOwnerClosingMidRetrieveIsSafe) {
  const uint64_t scheduler = Open(kGroup), worker = Open(kGroup);
  const uint64_t claimed_lease = Lease(scheduler, {K(1), K(2)});
  Lease(scheduler, {K(3)});  // not claimed: ends with the session
  auto claimed = sessions_.ClaimLeases(worker, {claimed_lease}, {K(1), K(2)});
  ASSERT_TRUE(claimed.ok());
  ASSERT_TRUE(sessions_.Close(scheduler).ok());
  EXPECT_EQ(pins_.Total(), 2);  // the Retrieve still reads K(1), K(2)
  // A new session (a new id) has nothing to do with the old owner's counts.
  const uint64_t next = Open(kGroup);
  claimed->reset();
  EXPECT_EQ(pins_.Total(), 0);
  EXPECT_EQ(sessions_.List().size(), 2u);
  for (const SessionSummary& row : sessions_.List()) EXPECT_EQ(row.pinned_blocks, 0u) << row.id;
  EXPECT_TRUE(sessions_.Close(next).ok());
}

}  // namespace
}  // namespace tutti::server

namespace tutti::server {
namespace {

// Issue 19: one session pinned the whole pool inside its per-session limits, and one uid with 15
// sessions took all of max_pinned_blocks. Pins are bounded per uid and as shares of the pool's
// slots, so another user's Lookups still pin and Stores always find unpinned blocks to evict.
class PinShareTest : public ::testing::Test {
 protected:
  static SessionManager::Options Limits() {
    SessionManager::Options o;
    o.max_sessions = 16;
    o.max_sessions_per_user = 8;
    o.max_pinned_blocks_per_session = 1000;  // no bound here: the pool is 100 slots
    o.max_pinned_blocks_per_user = 30;
    o.max_pinned_pool_share_per_user = 0.25;
    o.pool_slots = 100;  // per user: 25 (a quarter); all: 75
    return o;
  }
  uint64_t Open(uint32_t uid) {
    auto s = sessions_.Open("e", 7, "m", std::make_shared<FakeIo>(), 0, uid);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return 0;
    tokens_[(*s)->id] = (*s)->token;
    return (*s)->id;
  }
  absl::StatusOr<SessionRef> Touch(uint64_t session) {
    return sessions_.Touch(session, tokens_[session]);
  }
  absl::StatusOr<uint64_t> Lease(uint64_t session, uint64_t first, uint64_t n) {
    std::vector<Key> keys;
    for (uint64_t i = 0; i < n; ++i) keys.push_back(K(first + i));
    pins_.Pin(keys);
    absl::StatusOr<uint64_t> id = sessions_.AddLease(session, keys);
    if (!id.ok()) pins_.Unpin(7, keys);
    return id;
  }
  static void ExpectLimit(const absl::Status& s, const std::string& limit) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(limit));
  }

  std::map<uint64_t, std::string> tokens_;
  ManualClock clock_{1000};
  FakePins pins_;
  SessionManager sessions_{Limits(), &clock_, [this](NamespaceId ns, absl::Span<const Key> keys) {
                             pins_.Unpin(ns, keys);
                           }};
};

TEST_F(PinShareTest, TheLimitsAreTheLowerOfCountAndPoolShare) {
  EXPECT_EQ(sessions_.user_pin_limit(), 25u);
  EXPECT_EQ(sessions_.pin_limit(), 75u);
  SessionManager::Options o = Limits();
  o.pool_slots = 0;  // no pool known: the counts alone
  SessionManager counts(o, &clock_, [](NamespaceId, absl::Span<const Key>) {});
  EXPECT_EQ(counts.user_pin_limit(), 30u);
  EXPECT_EQ(counts.pin_limit(), o.max_pinned_blocks);
  o.pool_slots = 3;  // a quarter of 3 slots: still one pin
  SessionManager tiny(o, &clock_, [](NamespaceId, absl::Span<const Key>) {});
  EXPECT_EQ(tiny.user_pin_limit(), 1u);
}

TEST_F(PinShareTest, OneUsersSessionsTogetherKeepToItsShare) {
  // Four sessions of one uid: each within its own bounds, together at most a quarter of the pool.
  std::vector<uint64_t> hog;
  for (int i = 0; i < 4; ++i) hog.push_back(Open(1000));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Lease(hog[i], 100 * i, 6).ok()) << i;
  ExpectLimit(Lease(hog[0], 900, 2).status(), "limits.max_pinned_pool_share_per_user = 0.25");
  EXPECT_TRUE(Lease(hog[1], 900, 1).ok()) << "25 of 25: all or nothing, up to the bound";
  ExpectLimit(Lease(Open(1000), 950, 1).status(), "uid 1000");
  EXPECT_EQ(pins_.Total(), 25);
  // Another user keeps its own share.
  const uint64_t other = Open(1001);
  EXPECT_TRUE(Lease(other, 2000, 25).ok());
}

TEST_F(PinShareTest, AllUsersTogetherLeaveAQuarterOfThePoolUnpinned) {
  for (uint32_t uid = 1; uid <= 3; ++uid) ASSERT_TRUE(Lease(Open(uid), 100 * uid, 25).ok()) << uid;
  ExpectLimit(Lease(Open(4), 900, 1).status(), "limits.max_pinned_pool_share = 0.75 of 100 slots");
  EXPECT_EQ(pins_.Total(), 75);
}

TEST_F(PinShareTest, TheCountBoundsWhereItIsLowerThanTheShare) {
  SessionManager::Options o = Limits();
  o.max_pinned_blocks_per_user = 10;
  SessionManager m(o, &clock_,
                   [this](NamespaceId ns, absl::Span<const Key> keys) { pins_.Unpin(ns, keys); });
  auto s = m.Open("e", 7, "m", std::make_shared<FakeIo>(), 0, 1000);
  ASSERT_TRUE(s.ok());
  pins_.Pin({K(1)});
  std::vector<Key> eleven;
  for (uint64_t i = 0; i < 11; ++i) eleven.push_back(K(i));
  ExpectLimit(m.AddLease((*s)->id, eleven).status(), "limits.max_pinned_blocks_per_user = 10");
  ASSERT_TRUE(m.AddLease((*s)->id, {K(1)}).ok());
}

TEST_F(PinShareTest, ClaimedPinsCountAgainstTheUidUntilTheRetrieveEnds) {
  const uint64_t a = Open(1000), b = Open(1000);
  auto lease = Lease(a, 0, 20);
  ASSERT_TRUE(lease.ok());
  {
    std::vector<Key> keys = {K(0)};
    auto claimed = sessions_.ClaimLeases(a, {*lease}, keys);
    ASSERT_TRUE(claimed.ok());
    ASSERT_TRUE(sessions_.Close(a).ok());  // the owner goes; its claim still pins
    ExpectLimit(Lease(b, 100, 6).status(), "limits.max_pinned_pool_share_per_user");
  }
  EXPECT_TRUE(Lease(b, 100, 25).ok()) << "the uid's pins came back with the claim";
}

TEST_F(PinShareTest, TheOperatorEndsASessionsLeasesOrTheSession) {
  const uint64_t hog = Open(1000);
  ASSERT_TRUE(Lease(hog, 0, 10).ok());
  ASSERT_TRUE(Lease(hog, 100, 15).ok());
  ExpectLimit(Lease(hog, 200, 1).status(), "limits.max_pinned_pool_share_per_user");

  auto ended = sessions_.End(hog, /*leases_only=*/true);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->leases_ended, 2u);
  EXPECT_EQ(ended->pins_released, 25u);
  EXPECT_FALSE(ended->session_closed);
  EXPECT_EQ(pins_.Total(), 0);
  ASSERT_TRUE(Touch(hog).ok()) << "the session stays";
  EXPECT_EQ(sessions_.List()[0].leases, 0u);
  EXPECT_EQ(sessions_.List()[0].pinned_blocks, 0u);

  ASSERT_TRUE(Lease(hog, 300, 25).ok()) << "its uid's share is free again";
  ended = sessions_.End(hog, /*leases_only=*/false);
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->leases_ended, 1u);
  EXPECT_EQ(ended->pins_released, 25u);
  EXPECT_TRUE(ended->session_closed);
  EXPECT_EQ(pins_.Total(), 0);
  EXPECT_EQ(Touch(hog).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sessions_.End(hog, true).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sessions_.End(12345, false).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tutti::server
