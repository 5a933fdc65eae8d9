#include "daemon/decision/split.h"

#include <algorithm>

namespace tutti::decision {
namespace {

uint32_t MaxLoadBlocks(const SplitInput& in) {
  const uint32_t leave_one = (in.prompt_tokens - 1) / in.block_tokens;
  return std::min<uint32_t>(static_cast<uint32_t>(in.hit_in_dram.size()), leave_one);
}

double BlockLoadMs(const SplitInput& in, uint32_t block) {
  const double bps = in.hit_in_dram[block] ? in.dram_bytes_per_sec : in.ssd_bytes_per_sec;
  return 1e3 * static_cast<double>(in.layer_bytes) / bps;
}

// The formula of split.h, from one layer's load and compute times.
double Ttft(const SplitInput& in, double load_ms, double compute_ms) {
  return in.overhead_ms + load_ms + (in.num_layers - 1) * std::max(compute_ms, load_ms) +
         compute_ms;
}

double ComputeMs(const SplitInput& in, uint32_t load_blocks) {
  return in.layer_ms(in.prompt_tokens, load_blocks * in.block_tokens);
}

}  // namespace

double PredictTtftMs(const SplitInput& in, uint32_t load_blocks) {
  double load_ms = 0;
  for (uint32_t b = 0; b < load_blocks; ++b) load_ms += BlockLoadMs(in, b);
  return Ttft(in, load_ms, ComputeMs(in, load_blocks));
}

Split ChooseSplit(const SplitInput& in) {
  const uint32_t kmax = MaxLoadBlocks(in);
  Split best;
  double load_ms = 0;
  for (uint32_t k = 0; k <= kmax; ++k) {
    if (k > 0) load_ms += BlockLoadMs(in, k - 1);
    const double ttft = Ttft(in, load_ms, ComputeMs(in, k));
    if (k == 0) best.recompute_ms = ttft;
    if (k == kmax) best.load_all_ms = ttft;
    if (k == 0 || ttft <= best.ttft_ms) {
      best.load_blocks = k;
      best.ttft_ms = ttft;
    }
  }
  const double pure_ms = std::min(best.recompute_ms, best.load_all_ms);
  if (best.load_blocks > 0 && best.load_blocks < kmax &&
      best.ttft_ms > (1 - in.min_interior_gain) * pure_ms) {
    const bool load_all = best.load_all_ms <= best.recompute_ms;
    best.load_blocks = load_all ? kmax : 0;
    best.ttft_ms = pure_ms;
  }
  return best;
}

}  // namespace tutti::decision
