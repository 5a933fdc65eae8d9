// The load-or-recompute split: how many leading cached blocks of a prompt to load so that the
// predicted time to first token is least. Pure arithmetic over its inputs (docs/decision.md).
//
// Loading k blocks (K = k * block_tokens tokens) leaves n = T - K tokens to compute. Layers are
// pipelined: layer l's KV loads while layer l - 1 computes, so with
//   load(k)    = sum over the first k blocks b of layer_bytes / bandwidth(tier of b)   (per layer)
//   compute(k) = the compute model's layer time for n new tokens with K cached          (per layer)
// the predicted time to first token over N layers is
//   TTFT(k) = overhead + load(k) + (N - 1) * max(compute(k), load(k)) + compute(k)
// (load layer 0; then each layer l < N - 1 computes while layer l + 1 loads; the last layer
// computes alone). A load from the DRAM tier alone also pays dram_fixed_ms once, before its first
// layer lands (the Retrieve's fixed part, datapath::BandwidthEstimate::fixed_seconds; its bytes
// then move at the marginal rate): on the H200's DRAM grid (stop 34) bytes over one rate
// over-predicted 0.5 GB loads by 31-44% and under-predicted 2-4 GB ones by 13-14%. Candidates are k in [0, kmax], kmax = min(hits, (T - 1) / block_tokens): at
// least one prompt token is always computed, since the first token's logits need it. The least
// TTFT wins; ties go to more loading. A split strictly between the two pure strategies (load
// nothing, load everything) is taken only if its TTFT is below (1 - min_interior_gain) times the
// better pure one's, else the better pure one: an interior split overlaps loading with computing,
// which costs more than the model sees (on the H200, interior splits predicted 2-7% faster than
// recomputing ran 6-11% slower), so a win inside the model's error is not worth it.
//
// Corrections and uncertainty (docs/decision.md, "Robust advice"). Measured TTFTs scale the
// predictions: TTFT(0) by recompute_scale, TTFT(k > 0) by load_scales[LoadShareClass(k)] (the
// corrections of loads that loaded a like share of the prompt). The prediction carries an
// interval: its high end for k > 0 loads at the pessimistic bandwidths (*_low_bytes_per_sec) and
// computes at layer_ms x (1 + load_compute_spread), its low end is the central figure; recomputing
// computes at layer_ms x (1 -+ recompute_spread) at its ends. With no spread and the central
// bandwidths as the low ones, the choice below is the rule above.
//
// The choice (minimax regret over a small candidate set). The candidates, simplest first:
// recomputing (k = 0), loading everything (k = kmax, if kmax > 0), and the central best above if
// it is an interior split (it already beat the better pure strategy centrally by
// min_interior_gain). A candidate's worst-case regret is the largest ratio of its high end to
// another candidate's low end: how much slower than the best alternative it can turn out,
// everything within the intervals. The central best stands if its worst-case regret is at most 1
// (it wins beyond the uncertainty; exact ties go to more loading, as above). Otherwise the
// candidate with the least worst-case regret, where a less simple one replaces a simpler one only
// if its regret is smaller by more than kRegretNearTie (1%): ties and near-ties go to recomputing
// (it needs no device), then to loading everything. Recomputing is not free of risk either:
// - The H200's virtio disk, T = 16K, 50% cached (2026-12-03, stop 33): the central best loaded
//   456 of 512 hits, predicted 511 ms (high end 588), recomputing 579.8 (568.2-591.3), loading all
//   571 (644 at the pessimistic 1.72 GB/s). The rule of that run (an interior split only beyond
//   the whole interval; between the pure strategies the smaller worst case) recomputed and ran
//   596 ms, 1.098x loading all (543). Worst-case regrets: the split 1.035, recomputing 1.156,
//   loading all 1.259: the split is taken (robust_test, MinimaxTakesTheSplitAtSsd16KHalfCached).
// - The throttled disk, T = 4K (robust_test, ThrottledDiskAt4KNoLongerLoads): a split of 48
//   blocks predicted 121 ms but its high end at the newest Read's rate is 195 against
//   recomputing's 137-143: regrets 1.42 against 1.18, recomputing is kept (the split ran 1.16-1.59x
//   recomputing there).
// Between the two pure strategies alone (the central best is one) this is the rule of 621d027,
// loading all where its worst case against recomputing is the smaller (T = 16K, 50% on the virtio
// disk at 2.03 GB/s: 1.05x against 1.11x), except that a near tie now recomputes.
//
// Thread-safety: pure functions.
#ifndef TUTTI_DAEMON_DECISION_SPLIT_H_
#define TUTTI_DAEMON_DECISION_SPLIT_H_

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

namespace tutti::decision {

// A less simple candidate replaces a simpler one only if its worst-case regret is smaller by more
// than this share (see "The choice").
inline constexpr double kRegretNearTie = 0.01;

// Classes of loads by the share of the prompt they load (LoadShareClass).
inline constexpr uint32_t kLoadShareClasses = 4;

struct SplitInput {
  uint32_t num_layers = 0;        // N (>= 1)
  uint32_t block_tokens = 0;      // tokens per block (>= 1)
  uint32_t prompt_tokens = 0;     // T (>= 1)
  uint64_t layer_bytes = 0;       // one block's bytes of one layer (all its parts)
  std::vector<bool> hit_in_dram;  // one per hit, in chain order: DRAM tier (true) or SSD
  double dram_bytes_per_sec = 0;  // > 0
  double ssd_bytes_per_sec = 0;   // > 0
  // Paid once by a load of k > 0 blocks all in the DRAM tier (above); 0: none.
  double dram_fixed_ms = 0;
  double overhead_ms = 0;
  double min_interior_gain = 0;  // in [0, 1): see above
  // Uncertainty and corrections (see above); the defaults add none.
  double dram_low_bytes_per_sec = 0;  // 0: dram_bytes_per_sec; else in (0, dram_bytes_per_sec]
  double ssd_low_bytes_per_sec = 0;   // 0: ssd_bytes_per_sec
  double recompute_spread = 0;        // relative, in [0, 1)
  double load_compute_spread = 0;     // relative, >= 0
  double recompute_scale = 1;         // > 0
  std::array<double, kLoadShareClasses> load_scales = {1, 1, 1, 1};  // each > 0
  // Per-layer compute ms of the last T - K of T tokens with the first K cached (K < T).
  std::function<double(uint32_t context_tokens, uint32_t cached_tokens)> layer_ms;
};

// The class of a load of `load_blocks` (> 0) blocks of `in`'s prompt: the quarter of the prompt's
// tokens it loads (0: under a quarter, ..., 3: three quarters or more).
uint32_t LoadShareClass(const SplitInput& in, uint32_t load_blocks);
// The correction of TTFT(load_blocks), load_blocks > 0: load_scales[LoadShareClass].
double LoadScale(const SplitInput& in, uint32_t load_blocks);

// One candidate of the choice (above): its k, its corrected central TTFT and interval, and its
// worst-case regret, its high end over the least low end of the other candidates.
struct SplitCandidate {
  uint32_t load_blocks = 0;
  double ttft_ms = 0, low_ms = 0, high_ms = 0;
  double regret = 0;
};

struct Split {
  uint32_t load_blocks = 0;
  double ttft_ms = 0;       // TTFT(load_blocks), corrected by its scale
  double recompute_ms = 0;  // TTFT(0)
  double load_all_ms = 0;   // TTFT(kmax)
  uint32_t max_load_blocks = 0;  // kmax: the hits a load may take (one prompt token is computed)
  // The interval of ttft_ms: for k = 0 the compute spread either way; for k > 0 from the central
  // bandwidths and compute (low) to the pessimistic ones (high).
  double ttft_low_ms = 0, ttft_high_ms = 0;
  // The central prediction's best k, when it loaded and another candidate was advised (its
  // worst-case regret the least, "The choice"), and the high end of its interval.
  uint32_t refused_load_blocks = 0;
  double refused_high_ms = 0;
  // The candidates weighed, simplest first: recomputing; loading everything (kmax > 0); the
  // central best interior split, if the central best is one.
  SplitCandidate candidates[3];
  uint32_t num_candidates = 0;
};

// TTFT(k) for one k in [0, kmax] of `in` (the formula above, without corrections or spread).
// Preconditions as for ChooseSplit.
double PredictTtftMs(const SplitInput& in, uint32_t load_blocks);

// The choice above: the central best k in [0, kmax] (the least corrected TTFT(k), ties: the larger
// k; an interior one only by min_interior_gain) if it wins beyond the uncertainty, else the
// candidate with the least worst-case regret. Preconditions: num_layers, block_tokens,
// prompt_tokens >= 1, both bandwidths > 0, layer_ms set, the scales > 0.
Split ChooseSplit(const SplitInput& in);

}  // namespace tutti::decision

#endif  // TUTTI_DAEMON_DECISION_SPLIT_H_
