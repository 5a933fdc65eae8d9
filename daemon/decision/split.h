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
// computes alone). Candidates are k in [0, kmax], kmax = min(hits, (T - 1) / block_tokens): at
// least one prompt token is always computed, since the first token's logits need it. The least
// TTFT wins; ties go to more loading. A split strictly between the two pure strategies (load
// nothing, load everything) is taken only if its TTFT is below (1 - min_interior_gain) times the
// better pure one's, else the better pure one: an interior split overlaps loading with computing,
// which costs more than the model sees (on the H200, interior splits predicted 2-7% faster than
// recomputing ran 6-11% slower), so a win inside the model's error is not worth it.
//
// Corrections and uncertainty (docs/decision.md, "Robust advice"). Measured TTFTs scale the
// predictions: TTFT(0) by recompute_scale, TTFT(k > 0) by load_scale. The prediction carries an
// interval: its high end for k > 0 loads at the pessimistic bandwidths (*_low_bytes_per_sec) and
// computes at layer_ms x (1 + load_compute_spread); the low end of recomputing computes at
// layer_ms x (1 - recompute_spread). A choice that loads (k > 0) stands only if its high end is
// at most recomputing's low end, that is, if it wins beyond the uncertainty; an interior split
// must also beat loading everything's high end by min_interior_gain. Otherwise the better of the
// two pure strategies as below. With no spread and the central bandwidths as the low ones, this
// is the rule above.
//
// Between the pure strategies (loading everything where it is the central best, or where an
// interior split was refused): loading everything if it wins beyond the uncertainty (its high end
// at most recomputing's low end); else, if it wins centrally, the one with the smaller worst-case
// ratio to the other, loading's high end / recomputing's low end against recomputing's high end /
// loading's low end (minimax regret). Recomputing is not free of risk either: on the H200's
// virtio disk, loading all of a 16K prompt's 8K cached tokens was predicted 546 ms (614 at the
// pessimistic bandwidth) against recomputing's 595 (583-607); the strict rule recomputed and ran
// 1.10x loading (598 against 541 ms), while loading's worst case was 1.05x.
//
// Thread-safety: pure functions.
#ifndef TUTTI_DAEMON_DECISION_SPLIT_H_
#define TUTTI_DAEMON_DECISION_SPLIT_H_

#include <cstdint>
#include <functional>
#include <vector>

namespace tutti::decision {

struct SplitInput {
  uint32_t num_layers = 0;        // N (>= 1)
  uint32_t block_tokens = 0;      // tokens per block (>= 1)
  uint32_t prompt_tokens = 0;     // T (>= 1)
  uint64_t layer_bytes = 0;       // one block's bytes of one layer (all its parts)
  std::vector<bool> hit_in_dram;  // one per hit, in chain order: DRAM tier (true) or SSD
  double dram_bytes_per_sec = 0;  // > 0
  double ssd_bytes_per_sec = 0;   // > 0
  double overhead_ms = 0;
  double min_interior_gain = 0;  // in [0, 1): see above
  // Uncertainty and corrections (see above); the defaults add none.
  double dram_low_bytes_per_sec = 0;  // 0: dram_bytes_per_sec; else in (0, dram_bytes_per_sec]
  double ssd_low_bytes_per_sec = 0;   // 0: ssd_bytes_per_sec
  double recompute_spread = 0;        // relative, in [0, 1)
  double load_compute_spread = 0;     // relative, >= 0
  double recompute_scale = 1;         // > 0
  double load_scale = 1;              // > 0
  // Per-layer compute ms of the last T - K of T tokens with the first K cached (K < T).
  std::function<double(uint32_t context_tokens, uint32_t cached_tokens)> layer_ms;
};

struct Split {
  uint32_t load_blocks = 0;
  double ttft_ms = 0;       // TTFT(load_blocks), corrected by its scale
  double recompute_ms = 0;  // TTFT(0)
  double load_all_ms = 0;   // TTFT(kmax)
  // The interval of ttft_ms: for k = 0 the compute spread either way; for k > 0 from the central
  // bandwidths and compute (low) to the pessimistic ones (high).
  double ttft_low_ms = 0, ttft_high_ms = 0;
  // The central prediction's best k, when it loaded and was refused for the uncertainty, and the
  // high end of its interval (what it had to beat: recomputing's low end, or loading everything's).
  uint32_t refused_load_blocks = 0;
  double refused_high_ms = 0;
};

// TTFT(k) for one k in [0, kmax] of `in` (the formula above, without corrections or spread).
// Preconditions as for ChooseSplit.
double PredictTtftMs(const SplitInput& in, uint32_t load_blocks);

// The k in [0, kmax] with the least corrected TTFT(k) (ties: the larger k), kept only if it wins
// beyond the uncertainty (above). Preconditions: num_layers, block_tokens, prompt_tokens >= 1,
// both bandwidths > 0, layer_ms set, the scales > 0.
Split ChooseSplit(const SplitInput& in);

}  // namespace tutti::decision

#endif  // TUTTI_DAEMON_DECISION_SPLIT_H_
