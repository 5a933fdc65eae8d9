// The compute model's least-squares fits recover the coefficients of exact samples.
#include "daemon/decision/compute_model.h"

#include <utility>

#include "gtest/gtest.h"

namespace tutti::decision {
namespace {

constexpr LayerFit kPlain{0.05, 2e-3, 3e-8};    // plain causal prefill (k == 0)
constexpr LayerFit kPrefixed{0.3, 1e-3, 5e-8};  // with a prefix cached (k > 0)

ComputeSample Exact(const LayerFit& f, uint32_t n, uint32_t t, double overhead = 0) {
  return ComputeSample{n, t, f.Eval(n, static_cast<double>(t) - n), overhead};
}

TEST(FitLayerTest, RecoversTheCoefficientsOfExactSamples) {
  std::deque<ComputeSample> s = {Exact(kPlain, 512, 512), Exact(kPlain, 4096, 4096),
                                 Exact(kPlain, 16384, 16384), Exact(kPlain, 32768, 32768)};
  const std::optional<LayerFit> fit = FitLayer(s);
  ASSERT_TRUE(fit.has_value());
  EXPECT_NEAR(fit->c0, kPlain.c0, 1e-6);
  EXPECT_NEAR(fit->c1, kPlain.c1, 1e-9);
  EXPECT_NEAR(fit->c2, kPlain.c2, 1e-13);
}

TEST(FitLayerTest, TooFewOrAlikeSamplesDoNotFit) {
  EXPECT_FALSE(FitLayer({Exact(kPlain, 512, 512), Exact(kPlain, 1024, 1024)}).has_value());
  EXPECT_FALSE(FitLayer({Exact(kPlain, 512, 512), Exact(kPlain, 512, 512), Exact(kPlain, 512, 512)})
                   .has_value());
}

TEST(ComputeModelTest, EachKindUsesItsOwnFit) {
  ComputeModel m;
  EXPECT_FALSE(m.LayerMs(1000, 0).has_value());
  for (uint32_t n : {1024u, 8192u, 32768u}) m.Add(Exact(kPlain, n, n, 2.0));
  for (auto [n, t] : {std::pair{1024u, 4096u}, {3000u, 32768u}, {16384u, 32768u}, {600u, 4096u}}) {
    m.Add(Exact(kPrefixed, n, t, 4.0));
  }
  EXPECT_NEAR(*m.LayerMs(16384, 0), kPlain.Eval(16384, 0), 1e-6);
  EXPECT_NEAR(*m.LayerMs(32768, 29488), kPrefixed.Eval(3280, 29488), 1e-6);
  EXPECT_NEAR(m.OverheadMs(), (3 * 2.0 + 4 * 4.0) / 7, 1e-12);
}

TEST(ComputeModelTest, AKindWithTooFewSamplesFallsBackToTheOther) {
  ComputeModel m;
  for (uint32_t n : {1024u, 8192u, 32768u}) m.Add(Exact(kPlain, n, n));
  m.Add(Exact(kPrefixed, 1000, 2000));  // one prefixed sample: not enough for its own fit
  EXPECT_NEAR(*m.LayerMs(32768, 16384), kPlain.Eval(16384, 16384), 1e-6);
}

TEST(ComputeModelTest, SamplesOfOneShapeScaleWithTheNewTokens) {
  ComputeModel m;
  for (int i = 0; i < 3; ++i) m.Add(ComputeSample{1000, 1000, 2.0, 0});
  EXPECT_NEAR(*m.LayerMs(2000, 0), 4.0, 1e-12);
  EXPECT_NEAR(*m.LayerMs(2000, 1500), 1.0, 1e-12);
}

TEST(ComputeModelTest, KeepsOnlyTheNewestSamples) {
  ComputeModel m;
  const LayerFit old{5.0, 1e-2, 1e-6};
  for (size_t i = 0; i < 100; ++i) m.Add(Exact(old, 100 + i, 100 + i));
  for (size_t i = 0; i < ComputeModel::kMaxSamples; ++i) {
    m.Add(Exact(kPlain, 100 + 100 * i, 100 + 100 * i));
  }
  EXPECT_NEAR(*m.LayerMs(20000, 0), kPlain.Eval(20000, 0), 1e-6) << "the old samples are gone";
}

}  // namespace
}  // namespace tutti::decision

namespace tutti::decision {
namespace {

TEST(ComputeModelTest, OutliersAreJudgedOnlyAgainstEnoughHistoryOfTheirKind) {
  ComputeModel m;
  const LayerFit f{0.05, 2e-3, 3e-8};
  for (uint32_t i = 0; i < ComputeModel::kOutlierMinSamples - 1; ++i) {
    const uint32_t n = 512 + 1024 * i;
    m.Add(ComputeSample{n, n, f.Eval(n, 0), 0});
  }
  const double at_8k = f.Eval(8192, 0);  // about 18 ms
  EXPECT_FALSE(m.Outlier({8192, 8192, 100 * at_8k, 0}).has_value()) << "too little history";
  m.Add(ComputeSample{8192, 8192, at_8k, 0});
  const std::optional<double> slow = m.Outlier({8192, 8192, 9 * at_8k + 1, 0});
  ASSERT_TRUE(slow.has_value());
  EXPECT_NEAR(*slow, at_8k, 1e-6);
  EXPECT_TRUE(m.Outlier({8192, 8192, at_8k / 10, 0}).has_value());
  EXPECT_FALSE(m.Outlier({8192, 8192, 7 * at_8k, 0}).has_value());
  EXPECT_FALSE(m.Outlier({8192, 8192, at_8k / 7, 0}).has_value());
  // A few tokens: within the 1 ms slack, whatever the fit's intercept says.
  EXPECT_FALSE(m.Outlier({1, 1, 0.9, 0}).has_value());
  // The other kind has no history of its own yet.
  EXPECT_FALSE(m.Outlier({1024, 8192, 100 * at_8k, 0}).has_value());
}

}  // namespace
}  // namespace tutti::decision

namespace tutti::decision {
namespace {

// The H200 grid's plain profile (layer_compute_ms_T*_k0, 2026-12-03) and one prefill reported at
// 4x its fit, as a cold first prefill was: the far one leaves the fit and the spread.
TEST(ComputeModelTest, OneSampleFarOffTheRestIsTrimmedFromFitAndSpread) {
  const std::pair<uint32_t, double> profile[] = {
      {2048, 1.881}, {4096, 3.876}, {8192, 8.155}, {16384, 18.676}, {32768, 45.069}};
  ComputeModel clean, with_cold;
  for (const auto& [t, ms] : profile) {
    clean.Add({t, t, ms, 1});
    with_cold.Add({t, t, ms, 1});
  }
  const double at_4000 = *clean.LayerMs(4000, 0);
  with_cold.Add({4000, 4000, 4 * at_4000, 1});
  EXPECT_EQ(clean.Trimmed(false), 0u);
  EXPECT_EQ(with_cold.Trimmed(false), 1u);
  EXPECT_EQ(with_cold.Samples(false), 6u);
  EXPECT_LE(with_cold.Spread(false), 0.05);
  EXPECT_NEAR(with_cold.Spread(false), clean.Spread(false), 1e-9);
  EXPECT_NEAR(*with_cold.LayerMs(32768, 0), *clean.LayerMs(32768, 0), 1e-9);
}

// An engine whose times truly scatter (every other prefill 35% slow) keeps its spread: the
// median residual is large, so nothing is trimmed.
TEST(ComputeModelTest, AScatteredEngineKeepsItsSpread) {
  const LayerFit f{0.05, 2e-3, 3e-8};
  ComputeModel m;
  for (uint32_t i = 0; i < 12; ++i) {
    const uint32_t n = 1024 + 2048 * i;
    m.Add({n, n, f.Eval(n, 0) * (i % 2 == 0 ? 1.0 : 1.35), 0});
  }
  EXPECT_EQ(m.Trimmed(false), 0u);
  EXPECT_GE(m.Spread(false), 0.12);
}

}  // namespace
}  // namespace tutti::decision
