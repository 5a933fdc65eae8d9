// Read bandwidth of each tier, measured online from the reads the data path serves.
//
// The load-or-recompute decision (daemon/decision) predicts how long loading a block takes from
// these figures, so they must describe what an engine sees: bytes delivered into its memory per
// second of a Read, from the first read posted to the last layer handed over (device time, the
// copy into the engine and verification all included).
//
// Each tier keeps an exponentially weighted mean of its samples' rates (weight `alpha` for the
// newest). A sample shorter than `min_sample_bytes` is ignored: small reads measure latency, not
// bandwidth. Until a tier has a sample, BytesPerSecond returns its prior.
//
// Thread-safety: every method may be called from any thread.
#ifndef TUTTI_DAEMON_DATAPATH_BANDWIDTH_H_
#define TUTTI_DAEMON_DATAPATH_BANDWIDTH_H_

#include <cstdint>

#include "absl/synchronization/mutex.h"

namespace tutti::datapath {

enum class Tier : uint8_t { kDram = 0, kSsd = 1 };
inline constexpr int kNumTiers = 2;
const char* TierName(Tier tier);

struct BandwidthOptions {
  double dram_prior_bytes_per_sec = 20e9;
  double ssd_prior_bytes_per_sec = 1e9;
  uint64_t min_sample_bytes = 8ull << 20;
  double alpha = 0.3;
};

struct TierBandwidth {
  double bytes_per_sec = 0;  // the estimate (the prior until measured)
  uint64_t samples = 0;      // samples taken in
  uint64_t bytes = 0;        // bytes over all samples taken in
  double seconds = 0;        // their time
};

class BandwidthMeter {
 public:
  explicit BandwidthMeter(const BandwidthOptions& options = {});

  // One Read's share of `tier`: `bytes` delivered in `seconds` (> 0). Ignored when too small.
  void Record(Tier tier, uint64_t bytes, double seconds);
  double BytesPerSecond(Tier tier) const;
  TierBandwidth Get(Tier tier) const;

 private:
  const BandwidthOptions options_;
  mutable absl::Mutex mu_;
  TierBandwidth tiers_[kNumTiers] ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_BANDWIDTH_H_
