// The engine's compute rate for one namespace: per-layer prefill time as a function of the tokens
// computed and the tokens already cached, fitted by least squares to the samples engines report.
//
// Model (n new tokens computed with k = T - n tokens' KV already present):
//   layer_ms(n, k) = c0 + c1 * n + c2 * (n * k + n * n / 2)
// c1 covers the per-token matmuls, c2 attention (each new token attends to the k cached tokens and
// on average half of the new ones). Two fits are kept: one over samples with k == 0 (plain causal
// prefill) and one over samples with k > 0, because torch SDPA takes a slower kernel once a prefix
// exists (../shared/FACTS.md: 45.9 ms at T = 32K, k = 4K against 37.7 ms at k = 0). A prediction
// uses the fit of its own kind, or the other one while its own has fewer than kMinSamples samples
// or cannot be solved (every sample of the same shape); with neither, a fit through the origin
// proportional to n over all samples. The prefill's time outside the layers (embedding, head,
// calls) is the mean of the samples' overhead_ms.
//
// Memory is bounded: the newest kMaxSamples samples of each kind are kept, the fits recomputed on
// each Add.
//
// Outliers (Outlier): once a kind has kOutlierMinSamples samples and its own fit, a new sample of
// that kind whose layer_ms is more than kOutlierFactor (8) times its prediction, or less than an
// eighth of it, each beyond kOutlierSlackMs (1 ms, so that layers of a few tokens, where the fit's
// intercept is least certain, are not judged by it), is an outlier: the Advisor refuses it. Per
// token and per layer that is the same rule (layer_ms / new_tokens against the prediction's).
// A real change of rate by more than 8x (another GPU) needs a new model: tuttid starts each empty.
//
// Trimming: of a kind with more than kMinSamples samples, a sample whose relative residual about
// the fit of all of them is beyond max(kTrimFloor, kTrimMads x 1.4826 x the median absolute
// residual) (three robust standard deviations, never within 25%) is left out of that kind's fit
// and spread while it is kept (Trimmed counts them). One sample far off the rest (on the H200, a
// cold first prefill of a grid's DRAM run) would otherwise hold the spread at kMaxSpread and every
// load off; a genuinely scattered engine keeps its scatter, since its median residual is large.
//
// Spread (Spread): how far the engine's reported times scatter about the fit, as the root mean
// square of the relative residuals (layer_ms / prediction - 1) of a kind's untrimmed samples, at
// least kMinSpread; a kind predicted from the other kind's fit, or from the fallback, is less sure:
// at least kBorrowedSpread. The advice widens its predictions by it (split.h).
//
// Thread-safety: none; the Advisor guards each model.
#ifndef TUTTI_DAEMON_DECISION_COMPUTE_MODEL_H_
#define TUTTI_DAEMON_DECISION_COMPUTE_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

namespace tutti::decision {

// One prefill's measurement (the engine API's ComputeSample). Preconditions of Add: 1 <= new_tokens
// <= context_tokens; layer_ms > 0 and overhead_ms >= 0, both finite (Advisor validates).
struct ComputeSample {
  uint32_t new_tokens = 0;
  uint32_t context_tokens = 0;
  double layer_ms = 0;
  double overhead_ms = 0;
};

// layer_ms = c0 + c1 * n + c2 * (n * k + n * n / 2).
struct LayerFit {
  double c0 = 0, c1 = 0, c2 = 0;
  double Eval(double n, double k) const { return c0 + c1 * n + c2 * (n * k + n * n / 2); }
};

// The least-squares fit of `samples` to the model, or nullopt when fewer than kMinSamples are
// given or the normal equations are singular (the samples do not tell the three terms apart).
std::optional<LayerFit> FitLayer(const std::deque<ComputeSample>& samples);

class ComputeModel {
 public:
  static constexpr size_t kMaxSamples = 256;  // per kind (k == 0, k > 0)
  static constexpr size_t kMinSamples = 3;
  static constexpr size_t kOutlierMinSamples = 16;  // of the sample's kind
  static constexpr double kOutlierFactor = 8;
  static constexpr double kOutlierSlackMs = 1;
  static constexpr double kMinSpread = 0.02;
  static constexpr double kBorrowedSpread = 0.2;
  static constexpr double kMaxSpread = 0.9;
  static constexpr double kTrimFloor = 0.25;
  static constexpr double kTrimMads = 3;

  void Add(const ComputeSample& sample);
  // The prediction `sample` is more than kOutlierFactor off (see the file comment), or nullopt
  // when it is not an outlier or the model has too few samples of its kind to tell.
  std::optional<double> Outlier(const ComputeSample& sample) const;
  bool empty() const { return plain_.empty() && prefixed_.empty(); }
  // Predicted per-layer ms for computing the last T - k of T tokens with the first k cached
  // (k < T), never below 0. nullopt when no sample was added.
  std::optional<double> LayerMs(uint32_t context_tokens, uint32_t cached_tokens) const;
  // The relative spread of predictions with (cached_tokens > 0) or without a cached prefix, in
  // [kMinSpread, kMaxSpread]; kMaxSpread when no sample was added.
  double Spread(bool prefixed) const;
  // Mean overhead_ms of the kept samples (0 when none).
  double OverheadMs() const;
  // How many kept samples of a kind its fit and spread leave out (see "Trimming").
  size_t Trimmed(bool prefixed) const { return prefixed ? prefixed_trimmed_ : plain_trimmed_; }
  size_t Samples(bool prefixed) const { return prefixed ? prefixed_.size() : plain_.size(); }

 private:
  struct KindFit {
    std::optional<LayerFit> fit;
    double spread = kMaxSpread;
    size_t trimmed = 0;
  };
  static KindFit FitKind(const std::deque<ComputeSample>& samples);
  void Refit();

  std::deque<ComputeSample> plain_;     // k == 0
  std::deque<ComputeSample> prefixed_;  // k > 0
  std::optional<LayerFit> plain_fit_, prefixed_fit_;
  double per_token_ms_ = 0;  // the fallback: layer_ms proportional to n, over all samples
  double plain_spread_ = kMaxSpread, prefixed_spread_ = kMaxSpread;  // of each own fit
  size_t plain_trimmed_ = 0, prefixed_trimmed_ = 0;
};

}  // namespace tutti::decision

#endif  // TUTTI_DAEMON_DECISION_COMPUTE_MODEL_H_
