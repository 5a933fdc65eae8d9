// KvCache.WatchEvents end to end over the unix socket: the first message's identities, STORED for
// a durable block with its key, a first watch from its session's attach on, REMOVED for an admin
// Evict, resume, one stream per session without a call slot, NOT_FOUND, the end of the stream when
// the session detaches, and a stream that never holds shutdown back.
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/server/kvcache_service.h"
#include "daemon/server/service_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

using ::testing::HasSubstr;
using tutti::v1::WatchEventsResponse;

class WatchEventsTest : public ::testing::Test {
 protected:
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<WatchEventsResponse>> reader;
  };

  std::unique_ptr<Stream> Watch(uint64_t session, uint64_t after_seq = 0, uint64_t boot_id = 0) {
    auto s = std::make_unique<Stream>();
    tutti::v1::WatchEventsRequest req;
    env_.Name(session, &req);
    req.set_after_seq(after_seq);
    req.set_boot_id(boot_id);
    s->reader = env_.kv().WatchEvents(&s->ctx, req);
    return s;
  }

  // Reads messages until `n` events have come (the first message's fields into *first if given).
  std::vector<tutti::v1::BlockEvent> ReadEvents(Stream& s, size_t n,
                                                WatchEventsResponse* first = nullptr) {
    std::vector<tutti::v1::BlockEvent> events;
    WatchEventsResponse msg;
    bool is_first = first != nullptr;
    while ((is_first || events.size() < n) && s.reader->Read(&msg)) {
      if (is_first) *first = msg;
      is_first = false;
      events.insert(events.end(), msg.events().begin(), msg.events().end());
    }
    EXPECT_EQ(events.size(), n);
    return events;
  }

  void StoreBlock(uint64_t session, uint64_t key) {
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

  uint32_t Hits(uint64_t session, uint64_t key) {
    tutti::v1::LookupRequest req;
    env_.Name(session, &req);
    req.add_keys(KeyBytes(key));
    grpc::ClientContext ctx;
    tutti::v1::LookupResponse resp;
    grpc::Status s = env_.kv().Lookup(&ctx, req, &resp);
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

  static EnvOptions OneCallPerSession() {
    EnvOptions o;
    o.max_calls_per_session = 1;
    return o;
  }

  ServiceEnv env_{OneCallPerSession()};
  ShmEngine engine_;
};

TEST_F(WatchEventsTest, FirstMessageNamesTheRunAndAStoredBlockComesWithItsKey) {
  const uint64_t session = env_.Attach(engine_);
  auto stream = Watch(session);
  WatchEventsResponse first;
  ReadEvents(*stream, 0, &first);
  const store::EventHub& hub = env_.store().events();
  EXPECT_EQ(first.pool_id(), hub.pool_id());
  EXPECT_EQ(first.boot_id(), hub.boot_id());
  EXPECT_NE(first.boot_id(), 0u);
  EXPECT_EQ(first.blocks_lost_at_start(), 0u);
  EXPECT_TRUE(first.resumed()) << "a first watch misses nothing since the session attached";
  StoreBlock(session, 41);
  auto events = ReadEvents(*stream, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq(), 1u);
  EXPECT_EQ(events[0].kind(), tutti::v1::BLOCK_STORED);
  EXPECT_EQ(events[0].key(), KeyBytes(41));
  EXPECT_EQ(Hits(session, 41), 1u) << "a STORED block is visible to Lookup";
  stream->ctx.TryCancel();
}

TEST_F(WatchEventsTest, AFirstWatchHasEveryEventSinceItsSessionAttachedAndNoneBefore) {
  // An engine's first stores may become durable before its watcher opens the stream (the vLLM
  // connector opens it once its rank has attached): they must not be missed.
  const uint64_t session = env_.Attach(engine_);
  StoreBlock(session, 5);
  auto stream = Watch(session);
  WatchEventsResponse first;
  auto events = ReadEvents(*stream, 1, &first);
  EXPECT_TRUE(first.resumed());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq(), 1u);
  EXPECT_EQ(events[0].kind(), tutti::v1::BLOCK_STORED);
  EXPECT_EQ(events[0].key(), KeyBytes(5));
  // A session attached after that store starts after it; it sees the next one.
  ShmEngine engine2;
  const uint64_t later = env_.Attach(engine2);
  auto later_stream = Watch(later);
  first.Clear();
  ReadEvents(*later_stream, 0, &first);
  EXPECT_TRUE(first.resumed());
  EXPECT_EQ(first.events_size(), 0) << "the STORED before this session's attach is not repeated";
  StoreBlock(session, 6);
  events = ReadEvents(*later_stream, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq(), 2u);
  EXPECT_EQ(events[0].key(), KeyBytes(6));
  stream->ctx.TryCancel();
  later_stream->ctx.TryCancel();
  // A watch that cannot resume (another run's seq, as after a restart and a new attach) still
  // starts at its session's attach: the STORED of 6, after `later` attached, is not missed.
  std::unique_ptr<Stream> other_run;
  WatchEventsResponse resumed_first;
  for (int tries = 0;; ++tries) {
    other_run = Watch(later, 1, env_.store().events().boot_id() + 1);
    resumed_first.Clear();
    if (other_run->reader->Read(&resumed_first)) break;
    ASSERT_EQ(other_run->reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    ASSERT_LT(tries, 50) << "the cancelled stream never ended";
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(resumed_first.resumed()) << "another run's seq does not resume";
  ASSERT_EQ(resumed_first.events_size(), 1);
  EXPECT_EQ(resumed_first.events(0).seq(), 2u);
  EXPECT_EQ(resumed_first.events(0).key(), KeyBytes(6));
  other_run->ctx.TryCancel();
}

TEST_F(WatchEventsTest, AdminEvictIsRemoved) {
  const uint64_t session = env_.Attach(engine_);
  StoreBlock(session, 7);
  auto stream = Watch(session);
  ASSERT_EQ(ReadEvents(*stream, 1).at(0).kind(), tutti::v1::BLOCK_STORED);
  tutti::v1::EvictRequest req;
  req.set_all(true);
  grpc::ClientContext ctx;
  tutti::v1::EvictResponse resp;
  ASSERT_TRUE(env_.admin().Evict(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.evicted(), 1u);
  auto events = ReadEvents(*stream, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq(), 2u);
  EXPECT_EQ(events[0].kind(), tutti::v1::BLOCK_REMOVED);
  EXPECT_EQ(events[0].key(), KeyBytes(7));
  stream->ctx.TryCancel();
}

TEST_F(WatchEventsTest, ResumeGivesExactlyTheEventsAfterTheSeqOfTheSameRun) {
  const uint64_t session = env_.Attach(engine_);
  StoreBlock(session, 1);
  StoreBlock(session, 2);
  StoreBlock(session, 3);
  const uint64_t boot = env_.store().events().boot_id();
  auto stream = Watch(session, 1, boot);
  WatchEventsResponse first;
  auto events = ReadEvents(*stream, 2, &first);
  EXPECT_TRUE(first.resumed());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].seq(), 2u);
  EXPECT_EQ(events[0].key(), KeyBytes(2));
  EXPECT_EQ(events[1].seq(), 3u);
  stream->ctx.TryCancel();
  // Another session of the namespace (this one's stream may still be ending), another run's seq.
  ShmEngine engine2;
  auto other_run = Watch(env_.Attach(engine2), 1, boot + 1);
  first.Clear();
  ReadEvents(*other_run, 0, &first);
  EXPECT_EQ(first.boot_id(), boot);
  EXPECT_FALSE(first.resumed());
  EXPECT_EQ(first.events_size(), 0);
  other_run->ctx.TryCancel();
}

TEST_F(WatchEventsTest, OneStreamPerSessionAndItTakesNoCallSlot) {
  const uint64_t session = env_.Attach(engine_);
  auto stream = Watch(session);
  ReadEvents(*stream, 0, nullptr);
  WatchEventsResponse msg;
  ASSERT_TRUE(stream->reader->Read(&msg));  // running
  // max_calls_per_session is 1: a Lookup still gets in beside the stream.
  EXPECT_EQ(Hits(session, 5), 0u);
  auto second = Watch(session);
  EXPECT_FALSE(second->reader->Read(&msg));
  grpc::Status s = second->reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("one per session"));
  stream->ctx.TryCancel();
}

TEST_F(WatchEventsTest, UnknownSessionIsNotFound) {
  auto stream = Watch(424242);
  WatchEventsResponse msg;
  EXPECT_FALSE(stream->reader->Read(&msg));
  grpc::Status s = stream->reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
}

TEST_F(WatchEventsTest, TheStreamEndsWhenTheSessionDetaches) {
  const uint64_t session = env_.Attach(engine_);
  auto stream = Watch(session);
  WatchEventsResponse msg;
  ASSERT_TRUE(stream->reader->Read(&msg));
  tutti::v1::DetachRequest req;
  env_.Name(session, &req);
  grpc::ClientContext ctx;
  tutti::v1::DetachResponse resp;
  ASSERT_TRUE(env_.kv().Detach(&ctx, req, &resp).ok());
  EXPECT_FALSE(stream->reader->Read(&msg));
  grpc::Status s = stream->reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(WatchEventsTest, ShutdownEndsARunningStreamWithoutWaitingForTheGrace) {
  const uint64_t session = env_.Attach(engine_);
  auto stream = Watch(session);
  WatchEventsResponse msg;
  ASSERT_TRUE(stream->reader->Read(&msg));
  const absl::Time t0 = absl::Now();
  env_.server().Shutdown(absl::Seconds(30));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10)) << "the stream held shutdown for its grace";
  EXPECT_FALSE(stream->reader->Read(&msg));
  grpc::Status s = stream->reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

}  // namespace
}  // namespace tutti::server::testing
