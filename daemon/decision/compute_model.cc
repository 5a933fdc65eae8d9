#include "daemon/decision/compute_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

namespace tutti::decision {
namespace {

// Features scaled so that the normal equations stay well conditioned at 32K-token contexts.
constexpr double kScale1 = 1e3, kScale2 = 1e6;

using Row = std::array<double, 3>;

Row Features(const ComputeSample& s) {
  const double n = s.new_tokens;
  const double k = static_cast<double>(s.context_tokens) - n;
  return {1.0, n / kScale1, (n * k + n * n / 2) / kScale2};
}

// Solves a * x = b (3x3) by Gaussian elimination with partial pivoting; false when a pivot is
// negligible against the matrix's largest diagonal entry.
bool Solve3(std::array<Row, 3> a, Row b, Row* x) {
  const double scale = std::max({a[0][0], a[1][1], a[2][2]});
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    if (std::fabs(a[pivot][col]) <= 1e-9 * scale) return false;
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    for (int r = col + 1; r < 3; ++r) {
      const double f = a[r][col] / a[col][col];
      for (int c = col; c < 3; ++c) a[r][c] -= f * a[col][c];
      b[r] -= f * b[col];
    }
  }
  for (int r = 2; r >= 0; --r) {
    double v = b[r];
    for (int c = r + 1; c < 3; ++c) v -= a[r][c] * (*x)[c];
    (*x)[r] = v / a[r][r];
  }
  return true;
}

// Root mean square of the relative residuals of `samples` about `fit`; kMaxSpread without one.
double RelativeRms(const std::deque<ComputeSample>& samples, const std::optional<LayerFit>& fit) {
  if (!fit.has_value() || samples.empty()) return ComputeModel::kMaxSpread;
  double sum = 0;
  for (const ComputeSample& s : samples) {
    const double n = s.new_tokens;
    const double predicted = fit->Eval(n, s.context_tokens - n);
    const double r = predicted > 0 ? s.layer_ms / predicted - 1 : 1;
    sum += r * r;
  }
  return std::sqrt(sum / samples.size());
}

}  // namespace

std::optional<LayerFit> FitLayer(const std::deque<ComputeSample>& samples) {
  if (samples.size() < ComputeModel::kMinSamples) return std::nullopt;
  std::array<Row, 3> ata{};
  Row aty{};
  // Relative least squares (each sample weighted by 1 / layer_ms^2): a layer of 4K tokens and
  // one of 32K count alike, so short prompts are not predicted from the long ones' residuals
  // (on the H200 an absolute fit predicted a 4K recompute at 2.7x its measured time).
  for (const ComputeSample& s : samples) {
    const Row f = Features(s);
    const double w2 = s.layer_ms > 0 ? 1.0 / (s.layer_ms * s.layer_ms) : 0.0;
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) ata[i][j] += w2 * f[i] * f[j];
      aty[i] += w2 * f[i] * s.layer_ms;
    }
  }
  Row c{};
  if (!Solve3(ata, aty, &c)) return std::nullopt;
  return LayerFit{c[0], c[1] / kScale1, c[2] / kScale2};
}

void ComputeModel::Add(const ComputeSample& sample) {
  std::deque<ComputeSample>& kind = sample.new_tokens == sample.context_tokens ? plain_ : prefixed_;
  kind.push_back(sample);
  if (kind.size() > kMaxSamples) kind.pop_front();
  Refit();
}

ComputeModel::KindFit ComputeModel::FitKind(const std::deque<ComputeSample>& samples) {
  KindFit out;
  out.fit = FitLayer(samples);
  if (!out.fit.has_value()) return out;
  if (samples.size() > kMinSamples) {
    std::vector<double> residuals;
    residuals.reserve(samples.size());
    for (const ComputeSample& s : samples) {
      const double n = s.new_tokens;
      const double predicted = out.fit->Eval(n, s.context_tokens - n);
      residuals.push_back(predicted > 0 ? std::fabs(s.layer_ms / predicted - 1) : 1);
    }
    std::vector<double> sorted = residuals;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double cut = std::max(kTrimFloor, kTrimMads * 1.4826 * median);
    std::deque<ComputeSample> kept;
    for (size_t i = 0; i < samples.size(); ++i) {
      if (residuals[i] <= cut) kept.push_back(samples[i]);
    }
    if (kept.size() < samples.size() && kept.size() >= kMinSamples) {
      if (std::optional<LayerFit> refit = FitLayer(kept)) {
        out.fit = refit;
        out.trimmed = samples.size() - kept.size();
        out.spread = RelativeRms(kept, out.fit);
        return out;
      }
    }
  }
  out.spread = RelativeRms(samples, out.fit);
  return out;
}

void ComputeModel::Refit() {
  const KindFit plain = FitKind(plain_);
  const KindFit prefixed = FitKind(prefixed_);
  plain_fit_ = plain.fit;
  prefixed_fit_ = prefixed.fit;
  plain_spread_ = plain.spread;
  prefixed_spread_ = prefixed.spread;
  plain_trimmed_ = plain.trimmed;
  prefixed_trimmed_ = prefixed.trimmed;
  double yn = 0, nn = 0;
  for (const auto* kind : {&plain_, &prefixed_}) {
    for (const ComputeSample& s : *kind) {
      yn += s.layer_ms * s.new_tokens;
      nn += static_cast<double>(s.new_tokens) * s.new_tokens;
    }
  }
  per_token_ms_ = nn > 0 ? yn / nn : 0;
}

double ComputeModel::Spread(bool prefixed) const {
  if (empty()) return kMaxSpread;
  const std::optional<LayerFit>& own = prefixed ? prefixed_fit_ : plain_fit_;
  double spread = prefixed ? prefixed_spread_ : plain_spread_;
  if (!own.has_value()) {
    const bool other_fit = (prefixed ? plain_fit_ : prefixed_fit_).has_value();
    spread = std::max(other_fit ? (prefixed ? plain_spread_ : prefixed_spread_) : kMaxSpread,
                      kBorrowedSpread);
  }
  return std::clamp(spread, kMinSpread, kMaxSpread);
}

std::optional<double> ComputeModel::LayerMs(uint32_t context_tokens, uint32_t cached_tokens) const {
  if (empty()) return std::nullopt;
  const double n = static_cast<double>(context_tokens) - cached_tokens;
  const std::optional<LayerFit>& own = cached_tokens == 0 ? plain_fit_ : prefixed_fit_;
  const std::optional<LayerFit>& other = cached_tokens == 0 ? prefixed_fit_ : plain_fit_;
  double ms = per_token_ms_ * n;
  if (own.has_value()) {
    ms = own->Eval(n, cached_tokens);
  } else if (other.has_value()) {
    ms = other->Eval(n, cached_tokens);
  }
  return std::max(ms, 0.0);
}

std::optional<double> ComputeModel::Outlier(const ComputeSample& sample) const {
  const bool plain = sample.new_tokens == sample.context_tokens;
  const std::deque<ComputeSample>& kind = plain ? plain_ : prefixed_;
  const std::optional<LayerFit>& fit = plain ? plain_fit_ : prefixed_fit_;
  if (kind.size() < kOutlierMinSamples || !fit.has_value()) return std::nullopt;
  const double n = sample.new_tokens;
  const double predicted = std::max(0.0, fit->Eval(n, sample.context_tokens - n));
  const bool slow = sample.layer_ms > kOutlierFactor * predicted + kOutlierSlackMs;
  const bool fast = sample.layer_ms * kOutlierFactor + kOutlierSlackMs < predicted;
  if (slow || fast) return predicted;
  return std::nullopt;
}

double ComputeModel::OverheadMs() const {
  double sum = 0;
  size_t count = 0;
  for (const auto* kind : {&plain_, &prefixed_}) {
    for (const ComputeSample& s : *kind) sum += s.overhead_ms;
    count += kind->size();
  }
  return count == 0 ? 0 : sum / count;
}

}  // namespace tutti::decision
