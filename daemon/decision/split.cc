#include "daemon/decision/split.h"

#include <algorithm>
#include <limits>

namespace tutti::decision {
namespace {

uint32_t MaxLoadBlocks(const SplitInput& in) {
  const uint32_t leave_one = (in.prompt_tokens - 1) / in.block_tokens;
  return std::min<uint32_t>(static_cast<uint32_t>(in.hit_in_dram.size()), leave_one);
}

double BlockLoadMs(const SplitInput& in, uint32_t block, bool pessimistic) {
  double bps = in.hit_in_dram[block] ? in.dram_bytes_per_sec : in.ssd_bytes_per_sec;
  const double low = in.hit_in_dram[block] ? in.dram_low_bytes_per_sec : in.ssd_low_bytes_per_sec;
  if (pessimistic && low > 0) bps = std::min(bps, low);
  return 1e3 * static_cast<double>(in.layer_bytes) / bps;
}

// The formula of split.h, from one layer's load and compute times and the load's fixed part.
double Ttft(const SplitInput& in, double load_ms, double compute_ms, double fixed_ms = 0) {
  return in.overhead_ms + fixed_ms + load_ms +
         (in.num_layers - 1) * std::max(compute_ms, load_ms) + compute_ms;
}

// The fixed part of a load of at least one block: dram_fixed_ms where all come from the DRAM tier.
double FixedPartMs(const SplitInput& in, bool all_dram) {
  return all_dram && in.dram_fixed_ms > 0 ? in.dram_fixed_ms : 0;
}

// The fixed part of loading the first `k` blocks.
double FixedMs(const SplitInput& in, uint32_t k) {
  if (k == 0) return 0;
  const auto end = in.hit_in_dram.begin() + k;
  return FixedPartMs(in, std::find(in.hit_in_dram.begin(), end, false) == end);
}

double ComputeMs(const SplitInput& in, uint32_t load_blocks) {
  return in.layer_ms(in.prompt_tokens, load_blocks * in.block_tokens);
}

}  // namespace

uint32_t LoadShareClass(const SplitInput& in, uint32_t load_blocks) {
  const uint64_t loaded = uint64_t{load_blocks} * in.block_tokens;
  return static_cast<uint32_t>(
      std::min<uint64_t>(kLoadShareClasses - 1, kLoadShareClasses * loaded / in.prompt_tokens));
}

double LoadScale(const SplitInput& in, uint32_t load_blocks) {
  return in.load_scales[LoadShareClass(in, load_blocks)];
}

namespace {

// Each k's corrected TTFT: central, and the ends of its interval.
struct Candidate {
  double mid = 0, low = 0, high = 0;
};

std::vector<Candidate> Candidates(const SplitInput& in, uint32_t kmax) {
  std::vector<Candidate> c(kmax + 1);
  double load_ms = 0, load_high_ms = 0;
  bool all_dram = true;  // blocks [0, k) all in the DRAM tier: FixedMs, kept as k grows
  for (uint32_t k = 0; k <= kmax; ++k) {
    if (k > 0) {
      load_ms += BlockLoadMs(in, k - 1, false);
      load_high_ms += BlockLoadMs(in, k - 1, true);
      all_dram = all_dram && in.hit_in_dram[k - 1];
    }
    const double compute = ComputeMs(in, k);
    if (k == 0) {
      c[k].mid = in.recompute_scale * Ttft(in, 0, compute);
      c[k].low = in.recompute_scale * Ttft(in, 0, compute * (1 - in.recompute_spread));
      c[k].high = in.recompute_scale * Ttft(in, 0, compute * (1 + in.recompute_spread));
    } else {
      const double fixed = FixedPartMs(in, all_dram);
      const double scale = LoadScale(in, k);
      c[k].mid = scale * Ttft(in, load_ms, compute, fixed);
      c[k].low = c[k].mid;
      c[k].high =
          scale * Ttft(in, load_high_ms, compute * (1 + in.load_compute_spread), fixed);
    }
  }
  return c;
}

// The least central TTFT (ties: the larger k), an interior one only by min_interior_gain.
uint32_t CentralBest(const SplitInput& in, const std::vector<Candidate>& c) {
  const uint32_t kmax = static_cast<uint32_t>(c.size()) - 1;
  uint32_t best = 0;
  for (uint32_t k = 1; k <= kmax; ++k) {
    if (c[k].mid <= c[best].mid) best = k;
  }
  const double pure = std::min(c[0].mid, c[kmax].mid);
  if (best > 0 && best < kmax && c[best].mid > (1 - in.min_interior_gain) * pure) {
    best = c[kmax].mid <= c[0].mid ? kmax : 0;
  }
  return best;
}

// a / b for TTFTs >= 0; an empty prediction (0) against another is 1 or unbounded.
double Ratio(double a, double b) {
  if (b > 0) return a / b;
  return a > 0 ? std::numeric_limits<double>::infinity() : 1;
}

// The candidates of the minimax rule (split.h, "The choice"), simplest first: recomputing,
// loading everything, the central best interior split; each with its worst-case regret.
std::vector<SplitCandidate> Weigh(const std::vector<Candidate>& c, uint32_t central) {
  const uint32_t kmax = static_cast<uint32_t>(c.size()) - 1;
  std::vector<SplitCandidate> w;
  w.push_back({0, c[0].mid, c[0].low, c[0].high, 0});
  if (kmax > 0) w.push_back({kmax, c[kmax].mid, c[kmax].low, c[kmax].high, 0});
  if (central > 0 && central < kmax) {
    w.push_back({central, c[central].mid, c[central].low, c[central].high, 0});
  }
  for (SplitCandidate& x : w) {
    for (const SplitCandidate& y : w) {
      if (&x != &y) x.regret = std::max(x.regret, Ratio(x.high_ms, y.low_ms));
    }
  }
  return w;
}

// The index into `w` of the choice (split.h, "The choice"): the central best if it wins beyond
// the uncertainty (worst-case regret at most 1), else the least worst-case regret, a candidate
// later in `w` (less simple) replacing an earlier one only by more than kRegretNearTie.
size_t Choose(const std::vector<SplitCandidate>& w, uint32_t central) {
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i].load_blocks == central && w[i].regret <= 1) return i;
  }
  size_t best = 0;
  for (size_t i = 1; i < w.size(); ++i) {
    if (w[i].regret * (1 + kRegretNearTie) < w[best].regret) best = i;
  }
  return best;
}

}  // namespace

double PredictTtftMs(const SplitInput& in, uint32_t load_blocks) {
  double load_ms = 0;
  for (uint32_t b = 0; b < load_blocks; ++b) load_ms += BlockLoadMs(in, b, false);
  return Ttft(in, load_ms, ComputeMs(in, load_blocks), FixedMs(in, load_blocks));
}

Split ChooseSplit(const SplitInput& in) {
  const uint32_t kmax = MaxLoadBlocks(in);
  const std::vector<Candidate> c = Candidates(in, kmax);
  const uint32_t central = CentralBest(in, c);
  const std::vector<SplitCandidate> w = Weigh(c, central);
  const uint32_t k = w[Choose(w, central)].load_blocks;
  Split s;
  s.load_blocks = k;
  s.ttft_ms = c[k].mid;
  s.ttft_low_ms = c[k].low;
  s.ttft_high_ms = c[k].high;
  s.recompute_ms = c[0].mid;
  s.load_all_ms = c[kmax].mid;
  s.max_load_blocks = kmax;
  if (k != central) {
    s.refused_load_blocks = central;
    s.refused_high_ms = c[central].high;
  }
  s.num_candidates = static_cast<uint32_t>(w.size());
  std::copy(w.begin(), w.end(), s.candidates);
  return s;
}

}  // namespace tutti::decision
