// The advisor: advice only once compute samples exist, ReportCompute's validation, and the
// prediction error of reported TTFTs.
#include "daemon/decision/advisor.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::decision {
namespace {

using ::testing::HasSubstr;

constexpr NamespaceId kNs = 7;
constexpr uint64_t kSession = 3;
constexpr uint32_t kUid = 1000;
const NamespaceShape kShape{4, 10, 1'000'000};
const Bandwidths kBw{1e12, 1e10};

void ExpectInvalid(const absl::Status& s, const std::string& field) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(field));
}

// 0.01 ms per new token and layer, no overhead (split's decision_test, mid case).
std::vector<ComputeSample> LinearSamples() {
  return {{100, 100, 1.0, 0}, {50, 50, 0.5, 0}, {10, 10, 0.1, 0}, {10, 100, 0.1, 0}};
}

TEST(AdvisorTest, NoAdviceWithoutSamplesOrPromptOrWhenOff) {
  Advisor advisor(true);
  const std::vector<bool> hits(10, false);
  Advice a = advisor.Advise(kNs, kSession, kShape, 101, hits, kBw);
  EXPECT_EQ(a.load_blocks, 10u);
  EXPECT_FALSE(a.predicted);
  EXPECT_EQ(a.decision_id, 0u);
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, LinearSamples(), 0, 0).ok());
  EXPECT_FALSE(advisor.Advise(kNs, kSession, kShape, 0, hits, kBw).predicted);
  EXPECT_FALSE(advisor.Advise(kNs + 1, kSession, kShape, 101, hits, kBw).predicted)
      << "models are per namespace";

  Advisor off(false);
  ASSERT_TRUE(off.Report(kNs, kSession, kUid, LinearSamples(), 0, 0).ok());
  EXPECT_EQ(off.Advise(kNs, kSession, kShape, 101, hits, kBw).load_blocks, 10u);
  EXPECT_EQ(off.Stats().decisions, 0u);
}

TEST(AdvisorTest, AdvisesTheSplitOnceSamplesExist) {
  Advisor advisor(true);
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, LinearSamples(), 0, 0).ok());
  const Advice a = advisor.Advise(kNs, kSession, kShape, 101, std::vector<bool>(10, false), kBw);
  ASSERT_TRUE(a.predicted);
  EXPECT_EQ(a.load_blocks, 5u);
  EXPECT_NEAR(a.ttft_ms, 2.54, 1e-6);
  EXPECT_NEAR(a.recompute_ms, 4.04, 1e-6);
  EXPECT_NEAR(a.load_all_ms, 4.01, 1e-6);
  EXPECT_NE(a.decision_id, 0u);
  EXPECT_EQ(advisor.Stats().decisions, 1u);
}

TEST(AdvisorTest, CountsThePredictionErrorOfItsOwnSessionsDecisions) {
  Advisor advisor(true);
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, LinearSamples(), 0, 0).ok());
  const std::vector<bool> hits(10, false);
  const Advice a = advisor.Advise(kNs, kSession, kShape, 101, hits, kBw);
  const Advice b = advisor.Advise(kNs, kSession, kShape, 101, hits, kBw);
  EXPECT_NE(a.decision_id, b.decision_id);

  auto other = advisor.Report(kNs, kSession + 1, kUid, {}, a.decision_id, 2.0);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->decision_found) << "another session's decision";
  auto r = advisor.Report(kNs, kSession, kUid, {}, a.decision_id, 2.0);  // predicted 2.54
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->decision_found);
  EXPECT_NEAR(r->prediction_error, 0.27, 1e-6);
  EXPECT_FALSE(advisor.Report(kNs, kSession, kUid, {}, a.decision_id, 2.0)->decision_found)
      << "one measurement per decision";
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, {}, b.decision_id, 2.54).ok());  // exact
  const AdvisorStats s = advisor.Stats();
  EXPECT_EQ(s.prediction_errors, 2u);
  EXPECT_NEAR(s.prediction_error_mean, 0.135, 1e-6);
  EXPECT_NEAR(s.prediction_error_last, 0.0, 1e-6);
}

TEST(AdvisorTest, ForgetsOldDecisions) {
  Advisor advisor(true);
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, LinearSamples(), 0, 0).ok());
  const std::vector<bool> hits(10, true);
  const uint64_t first = advisor.Advise(kNs, kSession, kShape, 101, hits, kBw).decision_id;
  for (size_t i = 0; i < Advisor::kMaxDecisions; ++i) {
    (void)advisor.Advise(kNs, kSession, kShape, 101, hits, kBw);
  }
  EXPECT_FALSE(advisor.Report(kNs, kSession, kUid, {}, first, 1.0)->decision_found);
}

TEST(AdvisorTest, ReportValidationNamesTheField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  ExpectInvalid(ValidateReport({{10, 10, 0, 0}}, 0, 0), "samples[0].layer_ms");
  ExpectInvalid(ValidateReport({{10, 10, 1, 0}, {10, 10, -1, 0}}, 0, 0), "samples[1].layer_ms");
  ExpectInvalid(ValidateReport({{10, 10, nan, 0}}, 0, 0), "samples[0].layer_ms");
  ExpectInvalid(ValidateReport({{10, 10, inf, 0}}, 0, 0), "samples[0].layer_ms");
  ExpectInvalid(ValidateReport({{11, 10, 1, 0}}, 0, 0), "samples[0].new_tokens");
  ExpectInvalid(ValidateReport({{0, 10, 1, 0}}, 0, 0), "samples[0].new_tokens");
  ExpectInvalid(ValidateReport({{10, kMaxContextTokens + 1, 1, 0}}, 0, 0),
                "samples[0].context_tokens");
  ExpectInvalid(ValidateReport({{10, 10, 1, -1}}, 0, 0), "samples[0].overhead_ms");
  ExpectInvalid(ValidateReport({{10, 10, 1, nan}}, 0, 0), "samples[0].overhead_ms");
  ExpectInvalid(
      ValidateReport(
          std::vector<ComputeSample>(kMaxSamplesPerReport + 1, ComputeSample{1, 1, 1, 0}), 0, 0),
      "samples: 1025 given");
  ExpectInvalid(ValidateReport({}, 5, 0), "decision_id");
  ExpectInvalid(ValidateReport({}, 0, 3.0), "measured_ttft_ms");
  ExpectInvalid(ValidateReport({}, 5, -3.0), "measured_ttft_ms");
  ExpectInvalid(ValidateReport({}, 5, nan), "measured_ttft_ms");
  EXPECT_TRUE(ValidateReport({{10, 10, 1, 0}}, 5, 3.0).ok());

  Advisor advisor(true);
  ExpectInvalid(
      advisor.Report(kNs, kSession, kUid, {{10, 10, 1, 0}, {10, 10, nan, 0}}, 0, 0).status(),
      "samples[1]");
  EXPECT_FALSE(
      advisor.Advise(kNs, kSession, kShape, 101, std::vector<bool>(10, true), kBw).predicted)
      << "a refused report records nothing";
}

// Issue 19: samples of 1e300 ms were accepted and forced "load everything".
TEST(AdvisorTest, SamplesAreBoundedToPhysicalValues) {
  ExpectInvalid(ValidateReport({{10, 10, 1e300, 0}}, 0, 0), "samples[0].layer_ms = 1e+300");
  ExpectInvalid(ValidateReport({{32768, 32768, kMaxLayerMs * 1.01, 0}}, 0, 0),
                "a minute per layer");
  EXPECT_TRUE(ValidateReport({{32768, 32768, kMaxLayerMs, 0}}, 0, 0).ok());
  // Per new token and layer: at least 1 ns, at most 1 s.
  ExpectInvalid(ValidateReport({{100000, 100000, 1e-5, 0}}, 0, 0), "ms per new token");
  ExpectInvalid(ValidateReport({{1, 1, 2000, 0}}, 0, 0), "samples[0].layer_ms");
  EXPECT_TRUE(ValidateReport({{1, 1, 1000, 0}, {100000, 100000, 0.1, 0}}, 0, 0).ok());
  ExpectInvalid(ValidateReport({{10, 10, 1, kMaxOverheadMs + 1}}, 0, 0), "samples[0].overhead_ms");
  ExpectInvalid(ValidateReport({}, 5, 1e300), "measured_ttft_ms");

  Advisor advisor(true);
  ExpectInvalid(
      advisor.Report(kNs, kSession, kUid, {{10, 10, 0.1, 0}, {10, 10, 1e300, 0}}, 0, 0).status(),
      "samples[1]");
  EXPECT_FALSE(
      advisor.Advise(kNs, kSession, kShape, 101, std::vector<bool>(10, true), kBw).predicted)
      << "nothing of the report was recorded";
}

// Plain prefills of 64 to 1984 tokens at 0.01 ms per token and layer, with a little noise.
std::vector<ComputeSample> History(size_t count) {
  std::vector<ComputeSample> out;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t n = 64 + 128 * static_cast<uint32_t>(i);  // 64 .. 1984 tokens
    out.push_back({n, n, 0.01 * n * (i % 2 == 0 ? 1.05 : 0.95), 0});
  }
  return out;
}

TEST(AdvisorTest, OutliersAgainstTheModelsHistoryAreRefused) {
  Advisor advisor(true);
  // Too little history to judge by: a sample far off is taken.
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, History(3), 0, 0).ok());
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, {{1000, 1000, 90, 0}}, 0, 0).ok());

  Advisor judged(true);
  ASSERT_TRUE(
      judged.Report(kNs, kSession, kUid, History(ComputeModel::kOutlierMinSamples), 0, 0).ok());
  const std::vector<bool> hits(10, false);
  const Advice before = judged.Advise(kNs, kSession, kShape, 101, hits, kBw);
  ASSERT_TRUE(before.predicted);
  // 1000 tokens are predicted at about 10 ms: 120 ms and 0.5 ms are outliers.
  const absl::Status slow =
      judged.Report(kNs, kSession, kUid, {{1000, 1000, 120, 0}}, 0, 0).status();
  ExpectInvalid(slow, "samples[0].layer_ms = 120");
  EXPECT_THAT(std::string(slow.message()), HasSubstr("8x off the model's prediction"));
  ExpectInvalid(
      judged.Report(kNs, kSession, kUid, {{500, 500, 5, 0}, {1000, 1000, 0.5, 0}}, 0, 0).status(),
      "samples[1]");
  const Advice after = judged.Advise(kNs, kSession, kShape, 101, hits, kBw);
  EXPECT_EQ(after.load_blocks, before.load_blocks);
  EXPECT_DOUBLE_EQ(after.ttft_ms, before.ttft_ms) << "refused reports record nothing";
  // Within 8x the model follows (the GPU got busier).
  EXPECT_TRUE(judged.Report(kNs, kSession, kUid, {{1000, 1000, 30, 0}}, 0, 0).ok());
}

// Issue 19: a session of another uid moved a victim's advice from (hits 4, load 4) to (4, 0).
TEST(AdvisorTest, OnlyTheModelsOwnerFeedsIt) {
  Advisor advisor(true);
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, LinearSamples(), 0, 0).ok());
  const std::vector<bool> hits(10, false);
  const Advice before = advisor.Advise(kNs, kSession, kShape, 101, hits, kBw);
  ASSERT_TRUE(before.predicted);

  const uint64_t attacker = kSession + 1;
  const std::vector<ComputeSample> free_compute(8, ComputeSample{100, 100, 1e-3, 0});
  const absl::Status denied = advisor.Report(kNs, attacker, kUid + 1, free_compute, 0, 0).status();
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << denied;
  EXPECT_THAT(std::string(denied.message()), HasSubstr("uid 1001"));
  const Advice after = advisor.Advise(kNs, kSession, kShape, 101, hits, kBw);
  EXPECT_EQ(after.load_blocks, before.load_blocks);
  EXPECT_DOUBLE_EQ(after.ttft_ms, before.ttft_ms);

  // Another session of the owner's uid feeds it; the other uid may still report the TTFT of its
  // own decision (that touches no model), and owns the model of a namespace it reports first.
  EXPECT_TRUE(advisor.Report(kNs, attacker + 1, kUid, LinearSamples(), 0, 0).ok());
  const Advice theirs = advisor.Advise(kNs, attacker, kShape, 101, hits, kBw);
  auto ttft = advisor.Report(kNs, attacker, kUid + 1, {}, theirs.decision_id, 3.0);
  ASSERT_TRUE(ttft.ok()) << ttft.status();
  EXPECT_TRUE(ttft->decision_found);
  EXPECT_TRUE(advisor.Report(kNs + 1, attacker, kUid + 1, LinearSamples(), 0, 0).ok());
  EXPECT_EQ(advisor.Report(kNs + 1, kSession, kUid, LinearSamples(), 0, 0).status().code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace tutti::decision
