// Read bandwidth of each tier, measured online from the reads the data path serves, with how sure
// the figure is now.
//
// The load-or-recompute decision (daemon/decision) predicts how long loading a block takes from
// these figures, so they must describe what an engine sees: bytes delivered into its memory per
// second of a Read, from the first read posted to the last layer handed over (device time, the
// copy into the engine and verification all included).
//
// Each tier keeps an exponentially weighted mean of its samples' rates and of their squared
// relative deviations from it (the spread). The newest sample weighs `alpha`; older evidence also
// fades with time: the mean's weight is (1 - alpha) x 0.5^(age / half_life_s), so after a quiet
// spell the next read nearly replaces it. A sample shorter than `min_sample_bytes` is ignored:
// small reads measure latency, not bandwidth. Until a tier has a sample, its mean is the prior and
// its spread `prior_spread`.
//
// Estimate() gives the mean and a pessimistic figure, `low`, for a read posted now:
//   low = min(mean x (1 - spread'), the newest sample's rate)   (SSD)
//   low = max(mean x (1 - spread'), min(mean, best))              (DRAM tier)
//   spread' = min(max_spread, spread + stale_widen_per_s x max(0, age - stale_after_s))
//   best = the fastest sample's rate, halved every half_life_s since it was taken
// where age is the time since the tier's newest sample: where tuttid has served no reads for a
// while, it is less sure the device is as it was, and says so (no probe reads). On the SSD a
// single slow read pulls `low` down at once: the device may have changed (throttled, worn, busy
// with another tenant). The DRAM tier does not change; its slow reads are reads that shared the
// GPU with an engine's heavy compute (without MPS the two time-slice), which say little of the
// next read, so they count only through the mean and the spread (a TTFT grid on the H200 saw one
// such read, during a 16K-token prefill, make the advice recompute where loading from DRAM was
// 3.6-7.5x faster). Nor do they widen its pessimistic figure while a recent read showed the
// tier's speed: the grid's load-all runs beside 16K-token prefills left a spread that held `low`
// near a tenth of the mean, and the advice recomputed where loading was 3.5-7.7x faster (H200,
// 2026-12-03). The write backlog (SetWriteBacklog, the store's captured blocks not
// yet durable) competes with reads for the SSD: samples taken while it was non-empty are kept in a
// second mean, "contended", and while a backlog exists Estimate(kSsd) answers from that mean, or,
// before any contended sample, from the uncontended one scaled by (1 - write_share_prior).
//
// Fixed cost and marginal rate (Estimate's fixed_seconds, marginal_bytes_per_sec). A Read's time
// is not bytes / one rate: it has a part that does not grow with its size (the Retrieve's setup
// until its first layer lands) and a rate for the rest. With samples of one size the two cannot
// be told apart and the mean says all; with samples of different sizes each tier also fits
//   seconds = fixed + bytes / marginal
// by least squares over its samples, each weighing 1 and fading by half every half_life_s (no
// alpha: one prompt's Reads are all of one size, and the fit needs the sizes of several). The fit
// is used where the samples' sizes differ by at least min_size_cv (relative weighted standard
// deviation of their bytes) and it gives fixed > 0 and marginal > 0; else
// fixed_seconds is 0 and marginal_bytes_per_sec the mean. On the H200's DRAM grid (2026-12-03,
// stop 34) the loads ran at 13-17 GB/s in effect at 0.5 GB and 23-26 GB/s at 2-4 GB: a fixed
// ~9 ms and ~27 GB/s fit every DRAM point within 9%, one rate none of them within 15%.
//
// Thread-safety: every method may be called from any thread.
#ifndef TUTTI_DAEMON_DATAPATH_BANDWIDTH_H_
#define TUTTI_DAEMON_DATAPATH_BANDWIDTH_H_

#include <cstdint>
#include <functional>

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
  double half_life_s = 30;       // older evidence halves its weight every half_life_s
  // Relative spread before a tier's first sample: 0, the configured prior is taken as stated
  // (the first Reads measure the device; advice past them carries their spread).
  double prior_spread = 0;
  double stale_after_s = 10;     // no sample for this long: the spread starts to widen
  double stale_widen_per_s = 0.01;
  double max_spread = 0.9;       // in (0, 1)
  // Share of the SSD's read rate a write backlog is assumed to take until a read under one has
  // measured it (config datapath.decision_write_share; in [0, 0.95]).
  double write_share_prior = 0.5;
  // Least relative spread of the samples' sizes for the fixed-cost fit (the file comment).
  double min_size_cv = 0.1;
  // Seconds on a monotonic clock; null: std::chrono::steady_clock. Tests pass a manual clock.
  std::function<double()> clock;
};

// One tier's running figures (metrics and Get).
struct TierBandwidth {
  double bytes_per_sec = 0;  // the mean (the prior until measured)
  double spread = 0;         // relative EW standard deviation (prior_spread until measured)
  double last_bytes_per_sec = 0;  // the newest sample's rate (0: none)
  double last_sample_s = 0;       // the clock at the newest sample
  double best_bytes_per_sec = 0;  // the fastest sample's rate, as of best_sample_s (0: none)
  double best_sample_s = 0;
  uint64_t samples = 0;      // samples taken in
  // Weighted sums of the samples for the fixed-cost fit (bytes in GB, seconds; the file
  // comment's weights, their sum w).
  double w = 0, wb = 0, ws = 0, wbb = 0, wbs = 0;
  uint64_t bytes = 0;        // bytes over all samples taken in
  double seconds = 0;        // their time
};

// What a read posted now may expect of a tier.
struct BandwidthEstimate {
  double bytes_per_sec = 0;      // the mean (contended while a write backlog exists)
  double low_bytes_per_sec = 0;  // the pessimistic figure (see the file comment); <= the mean
  double spread = 0;             // spread' of the file comment
  bool contended = false;        // a write backlog exists and was taken into account
  // A Read of B bytes takes fixed_seconds + B / marginal_bytes_per_sec (the file comment);
  // fixed_seconds 0 and marginal_bytes_per_sec = bytes_per_sec where the samples do not tell.
  double fixed_seconds = 0;
  double marginal_bytes_per_sec = 0;
};

class BandwidthMeter {
 public:
  explicit BandwidthMeter(const BandwidthOptions& options = {});

  // One Read's share of `tier`: `bytes` delivered in `seconds` (> 0). Ignored when too small.
  // Counted as contended when a write backlog exists at the time of the call.
  void Record(Tier tier, uint64_t bytes, double seconds);
  // The store's write backlog now, in bytes (0: none). Called by the store whenever it changes.
  void SetWriteBacklog(uint64_t bytes);

  BandwidthEstimate Estimate(Tier tier) const;
  double BytesPerSecond(Tier tier) const;  // Get(tier).bytes_per_sec
  TierBandwidth Get(Tier tier) const;      // uncontended figures
  TierBandwidth GetContended() const;      // the SSD's figures under a write backlog

 private:
  double Now() const;
  void Update(TierBandwidth& t, uint64_t bytes, double seconds, double now) const;
  // `ssd_rule`: the newest sample's rate caps `low`; else the DRAM tier's recent best raises it
  // (the file comment).
  BandwidthEstimate EstimateOf(const TierBandwidth& t, double now, bool ssd_rule) const;
  double DecayedBest(const TierBandwidth& t, double now) const;

  const BandwidthOptions options_;
  mutable absl::Mutex mu_;
  TierBandwidth tiers_[kNumTiers] ABSL_GUARDED_BY(mu_);
  TierBandwidth contended_ ABSL_GUARDED_BY(mu_);  // SSD reads taken while writes were queued
  uint64_t write_backlog_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_BANDWIDTH_H_
