// Load or recompute through the engine API: Lookup with prompt_tokens, Retrieve of the advised
// leading part of a lease, ReportCompute and its validation, the prediction error in Stats.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "daemon/server/kvcache_service.h"
#include "daemon/server/service_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

using ::testing::HasSubstr;

// The test namespace has 2 layers and 16-token blocks of 2 x 2 KiB per layer. At this SSD prior
// one block's layer loads in 0.16 ms; the samples below say 0.01 ms per new token and layer.
// A 65-token prompt with 4 hits: TTFT(k) = L + max(C, L) + C, L = 0.16 k, C = 0.01 (65 - 16 k):
// k = 0..4 -> 1.30, 1.14, 0.98, 1.13, 1.29: load 2 blocks.
constexpr double kSsdPrior = 4096 / 0.16e-3;
constexpr uint32_t kPrompt = 65;

EnvOptions Options(bool decision = true, uint64_t dram_bytes = 0) {
  EnvOptions o;
  o.decision = decision;
  o.dram_bytes = dram_bytes;
  o.bandwidth.ssd_prior_bytes_per_sec = kSsdPrior;
  o.bandwidth.prior_spread = 0;  // the prior taken as exact: these tests check the plumbing
  o.bandwidth.dram_prior_bytes_per_sec = 1e12;
  return o;
}

class DecisionServiceTest : public ::testing::Test {
 protected:
  explicit DecisionServiceTest(EnvOptions options = Options()) : env_(options) {}

  void SetUp() override {
    session_ = env_.Attach(engine_);
    ASSERT_NE(session_, 0u);
    tutti::v1::StoreRequest req;
    env_.Name(session_, &req);
    req.set_wait_durable(true);
    for (uint32_t b = 0; b < 4; ++b) {
      engine_.Fill(b, 100 + b);
      auto* p = req.add_blocks();
      p->set_key(KeyBytes(100 + b));
      p->set_engine_block(b);
    }
    tutti::v1::StoreResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(env_.kv().Store(&ctx, req, &resp).ok());
  }

  tutti::v1::LookupResponse Lookup(uint32_t prompt_tokens, grpc::Status* status = nullptr) {
    tutti::v1::LookupRequest req;
    env_.Name(session_, &req);
    for (uint64_t k = 100; k < 104; ++k) req.add_keys(KeyBytes(k));
    req.set_prompt_tokens(prompt_tokens);
    tutti::v1::LookupResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = env_.kv().Lookup(&ctx, req, &resp);
    if (status != nullptr)
      *status = s;
    else
      EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  grpc::Status Report(const std::vector<tutti::v1::ComputeSample>& samples,
                      uint64_t decision_id = 0, double measured = 0,
                      tutti::v1::ReportComputeResponse* resp = nullptr) {
    return ReportAs(session_, samples, decision_id, measured, resp);
  }
  grpc::Status ReportAs(uint64_t session, const std::vector<tutti::v1::ComputeSample>& samples,
                        uint64_t decision_id = 0, double measured = 0,
                        tutti::v1::ReportComputeResponse* resp = nullptr) {
    tutti::v1::ReportComputeRequest req;
    env_.Name(session, &req);
    for (const auto& s : samples) *req.add_samples() = s;
    req.set_decision_id(decision_id);
    req.set_measured_ttft_ms(measured);
    tutti::v1::ReportComputeResponse local;
    grpc::ClientContext ctx;
    return env_.kv().ReportCompute(&ctx, req, resp != nullptr ? resp : &local);
  }

  static tutti::v1::ComputeSample Sample(uint32_t n, uint32_t t, double layer_ms,
                                         double overhead_ms = 0) {
    tutti::v1::ComputeSample s;
    s.set_new_tokens(n);
    s.set_context_tokens(t);
    s.set_layer_ms(layer_ms);
    s.set_overhead_ms(overhead_ms);
    return s;
  }
  static std::vector<tutti::v1::ComputeSample> Linear() {
    return {Sample(64, 64, 0.64), Sample(32, 32, 0.32), Sample(16, 16, 0.16)};
  }

  static void ExpectError(const grpc::Status& s, grpc::StatusCode code, const std::string& part) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(part));
  }

  void Release(uint64_t lease) {
    tutti::v1::ReleaseRequest req;
    env_.Name(session_, &req);
    req.set_lease_id(lease);
    tutti::v1::ReleaseResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(env_.kv().Release(&ctx, req, &resp).ok());
  }

  ServiceEnv env_;
  ShmEngine engine_;
  uint64_t session_ = 0;
};

TEST_F(DecisionServiceTest, LookupLoadsEveryHitUntilAdviceIsPossible) {
  tutti::v1::LookupResponse r = Lookup(0);
  EXPECT_EQ(r.hits(), 4u);
  EXPECT_EQ(r.load_blocks(), 4u) << "no prompt_tokens: no advice";
  EXPECT_EQ(r.decision_id(), 0u);
  Release(r.lease_id());
  r = Lookup(kPrompt);
  EXPECT_EQ(r.load_blocks(), 4u) << "no compute samples yet";
  EXPECT_EQ(r.decision_id(), 0u);
  EXPECT_EQ(r.predicted_ttft_ms(), 0.0);
  Release(r.lease_id());
}

TEST_F(DecisionServiceTest, AdvisedPrefixIsRetrievedTheRestOfTheLeaseIsReleased) {
  ASSERT_TRUE(Report(Linear()).ok());
  const tutti::v1::LookupResponse r = Lookup(kPrompt);
  ASSERT_EQ(r.hits(), 4u);
  EXPECT_EQ(r.load_blocks(), 2u);
  EXPECT_NEAR(r.predicted_ttft_ms(), 0.98, 1e-6);
  EXPECT_NEAR(r.predicted_recompute_ms(), 1.30, 1e-6);
  EXPECT_NEAR(r.predicted_load_all_ms(), 1.29, 1e-6);
  ASSERT_NE(r.decision_id(), 0u);

  // Retrieve only the first load_blocks keys of the lease.
  tutti::v1::RetrieveRequest req;
  env_.Name(session_, &req);
  req.set_lease_id(r.lease_id());
  for (uint32_t b = 0; b < r.load_blocks(); ++b) {
    engine_.Zero(4 + b);
    auto* p = req.add_blocks();
    p->set_key(KeyBytes(100 + b));
    p->set_engine_block(4 + b);
  }
  grpc::ClientContext ctx;
  auto reader = env_.kv().Retrieve(&ctx, req);
  tutti::v1::RetrieveProgress progress;
  int layers = 0;
  while (reader->Read(&progress)) ++layers;
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(layers, 2);
  EXPECT_TRUE(engine_.Check(4, 100));
  EXPECT_TRUE(engine_.Check(5, 101));
  // Every pin of the lease ended with the call, the blocks not retrieved included.
  EXPECT_EQ(env_.sessions().List()[0].pinned_blocks, 0u);
  EXPECT_EQ(env_.store().Evict(0), (std::pair<uint64_t, uint64_t>{4, 0}));

  tutti::v1::ReportComputeResponse rr;
  ASSERT_TRUE(Report({}, r.decision_id(), 1.0, &rr).ok());
  EXPECT_TRUE(rr.decision_found());
  EXPECT_NEAR(rr.prediction_error(), 0.02, 1e-6);
  tutti::v1::StatsResponse stats;
  grpc::ClientContext sctx;
  ASSERT_TRUE(env_.admin().Stats(&sctx, tutti::v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.decisions(), 1u);
  EXPECT_EQ(stats.prediction_errors(), 1u);
  EXPECT_NEAR(stats.prediction_error_mean(), 0.02, 1e-6);
  EXPECT_NEAR(stats.prediction_error_last(), 0.02, 1e-6);
}

TEST_F(DecisionServiceTest, BadReportsAndPromptsAreInvalidArgumentNamingTheField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ExpectError(Report({Sample(16, 16, 0)}), grpc::StatusCode::INVALID_ARGUMENT,
              "samples[0].layer_ms");
  ExpectError(Report({Sample(16, 16, 1), Sample(16, 16, -1)}), grpc::StatusCode::INVALID_ARGUMENT,
              "samples[1].layer_ms");
  ExpectError(Report({Sample(16, 16, nan)}), grpc::StatusCode::INVALID_ARGUMENT,
              "samples[0].layer_ms");
  ExpectError(Report({Sample(17, 16, 1)}), grpc::StatusCode::INVALID_ARGUMENT,
              "samples[0].new_tokens");
  ExpectError(Report({Sample(16, 16, 1, -2)}), grpc::StatusCode::INVALID_ARGUMENT,
              "samples[0].overhead_ms");
  ExpectError(Report(std::vector<tutti::v1::ComputeSample>(1025, Sample(1, 1, 1))),
              grpc::StatusCode::INVALID_ARGUMENT, "samples: 1025 given");
  ExpectError(Report({}, 7, 0), grpc::StatusCode::INVALID_ARGUMENT, "measured_ttft_ms");
  grpc::Status s;
  Lookup((1u << 24) + 1, &s);
  ExpectError(s, grpc::StatusCode::INVALID_ARGUMENT, "prompt_tokens");
  EXPECT_EQ(Lookup(kPrompt).load_blocks(), 4u) << "nothing of the bad reports was recorded";

  tutti::v1::ReportComputeRequest unknown;
  env_.Name(session_ + 1000, &unknown);
  tutti::v1::ReportComputeResponse resp;
  grpc::ClientContext ctx;
  ExpectError(env_.kv().ReportCompute(&ctx, unknown, &resp), grpc::StatusCode::NOT_FOUND,
              "session");
}

// Issue 19: a session of another uid moved a victim's advice from (hits 4, load 4) to (4, 0), and
// samples of 1e300 ms were accepted.
TEST_F(DecisionServiceTest, AnotherUidsReportLeavesTheAdviceUnchanged) {
  ASSERT_TRUE(Report(Linear()).ok());
  tutti::v1::LookupResponse before = Lookup(kPrompt);
  ASSERT_EQ(before.load_blocks(), 2u);
  Release(before.lease_id());

  // A session of another user in the same namespace (as where namespaces are shared).
  const SessionSummary owner = env_.sessions().List()[0];
  auto other =
      env_.sessions().Open("other", owner.ns, owner.model_id, engine::MakeNoMemoryEngineIo(), 0,
                           owner.uid + 1, "", /*memoryless=*/true);
  ASSERT_TRUE(other.ok()) << other.status();
  tutti::v1::AttachResponse as_attached;  // the other engine calls with its own token
  as_attached.set_session_id((*other)->id);
  as_attached.set_session_token((*other)->token);
  env_.Remember(as_attached);
  const std::vector<tutti::v1::ComputeSample> free_compute(4, Sample(64, 64, 0.001));
  ExpectError(ReportAs((*other)->id, free_compute), grpc::StatusCode::PERMISSION_DENIED,
              "are not recorded");
  ExpectError(Report({Sample(64, 64, 1e300)}), grpc::StatusCode::INVALID_ARGUMENT,
              "samples[0].layer_ms = 1e+300");
  tutti::v1::LookupResponse after = Lookup(kPrompt);
  EXPECT_EQ(after.load_blocks(), before.load_blocks());
  EXPECT_DOUBLE_EQ(after.predicted_ttft_ms(), before.predicted_ttft_ms());
  Release(after.lease_id());
}

class DecisionOffTest : public DecisionServiceTest {
 protected:
  DecisionOffTest() : DecisionServiceTest(Options(/*decision=*/false)) {}
};

TEST_F(DecisionOffTest, OffAlwaysLoadsEveryHit) {
  ASSERT_TRUE(Report(Linear()).ok());
  const tutti::v1::LookupResponse r = Lookup(kPrompt);
  EXPECT_EQ(r.load_blocks(), 4u);
  EXPECT_EQ(r.decision_id(), 0u);
}

class DecisionDramTest : public DecisionServiceTest {
 protected:
  DecisionDramTest() : DecisionServiceTest(Options(true, 1 << 20)) {}
};

TEST_F(DecisionDramTest, HitsInTheDramTierAreAllLoaded) {
  ASSERT_TRUE(Report(Linear()).ok());
  const tutti::v1::LookupResponse r = Lookup(kPrompt);
  EXPECT_EQ(r.load_blocks(), 4u);
  EXPECT_NE(r.decision_id(), 0u);
  EXPECT_LT(r.predicted_ttft_ms(), r.predicted_recompute_ms());
}

}  // namespace
}  // namespace tutti::server::testing
