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
  ASSERT_TRUE(advisor.Report(kNs, kSession, LinearSamples(), 0, 0).ok());
  EXPECT_FALSE(advisor.Advise(kNs, kSession, kShape, 0, hits, kBw).predicted);
  EXPECT_FALSE(advisor.Advise(kNs + 1, kSession, kShape, 101, hits, kBw).predicted)
      << "models are per namespace";

  Advisor off(false);
  ASSERT_TRUE(off.Report(kNs, kSession, LinearSamples(), 0, 0).ok());
  EXPECT_EQ(off.Advise(kNs, kSession, kShape, 101, hits, kBw).load_blocks, 10u);
  EXPECT_EQ(off.Stats().decisions, 0u);
}

TEST(AdvisorTest, AdvisesTheSplitOnceSamplesExist) {
  Advisor advisor(true);
  ASSERT_TRUE(advisor.Report(kNs, kSession, LinearSamples(), 0, 0).ok());
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
  ASSERT_TRUE(advisor.Report(kNs, kSession, LinearSamples(), 0, 0).ok());
  const std::vector<bool> hits(10, false);
  const Advice a = advisor.Advise(kNs, kSession, kShape, 101, hits, kBw);
  const Advice b = advisor.Advise(kNs, kSession, kShape, 101, hits, kBw);
  EXPECT_NE(a.decision_id, b.decision_id);

  auto other = advisor.Report(kNs, kSession + 1, {}, a.decision_id, 2.0);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->decision_found) << "another session's decision";
  auto r = advisor.Report(kNs, kSession, {}, a.decision_id, 2.0);  // predicted 2.54
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->decision_found);
  EXPECT_NEAR(r->prediction_error, 0.27, 1e-6);
  EXPECT_FALSE(advisor.Report(kNs, kSession, {}, a.decision_id, 2.0)->decision_found)
      << "one measurement per decision";
  ASSERT_TRUE(advisor.Report(kNs, kSession, {}, b.decision_id, 2.54).ok());  // exact
  const AdvisorStats s = advisor.Stats();
  EXPECT_EQ(s.prediction_errors, 2u);
  EXPECT_NEAR(s.prediction_error_mean, 0.135, 1e-6);
  EXPECT_NEAR(s.prediction_error_last, 0.0, 1e-6);
}

TEST(AdvisorTest, ForgetsOldDecisions) {
  Advisor advisor(true);
  ASSERT_TRUE(advisor.Report(kNs, kSession, LinearSamples(), 0, 0).ok());
  const std::vector<bool> hits(10, true);
  const uint64_t first = advisor.Advise(kNs, kSession, kShape, 101, hits, kBw).decision_id;
  for (size_t i = 0; i < Advisor::kMaxDecisions; ++i) {
    (void)advisor.Advise(kNs, kSession, kShape, 101, hits, kBw);
  }
  EXPECT_FALSE(advisor.Report(kNs, kSession, {}, first, 1.0)->decision_found);
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
  ExpectInvalid(advisor.Report(kNs, kSession, {{10, 10, 1, 0}, {10, 10, nan, 0}}, 0, 0).status(),
                "samples[1]");
  EXPECT_FALSE(
      advisor.Advise(kNs, kSession, kShape, 101, std::vector<bool>(10, true), kBw).predicted)
      << "a refused report records nothing";
}

}  // namespace
}  // namespace tutti::decision
