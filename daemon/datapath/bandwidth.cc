#include "daemon/datapath/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace tutti::datapath {

const char* TierName(Tier tier) { return tier == Tier::kDram ? "dram" : "ssd"; }

BandwidthMeter::BandwidthMeter(const BandwidthOptions& options) : options_(options) {
  TierBandwidth& dram = tiers_[static_cast<int>(Tier::kDram)];
  TierBandwidth& ssd = tiers_[static_cast<int>(Tier::kSsd)];
  dram.bytes_per_sec = options.dram_prior_bytes_per_sec;
  ssd.bytes_per_sec = options.ssd_prior_bytes_per_sec;
  dram.spread = ssd.spread = options.prior_spread;
  contended_.bytes_per_sec = ssd.bytes_per_sec * (1 - options.write_share_prior);
  contended_.spread = options.prior_spread;
}

double BandwidthMeter::Now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double BandwidthMeter::DecayedBest(const TierBandwidth& t, double now) const {
  if (t.best_bytes_per_sec <= 0) return 0;
  return t.best_bytes_per_sec * std::exp2(-std::max(0.0, now - t.best_sample_s) /
                                          options_.half_life_s);
}

// The mean's old weight fades with time as well as per sample; the spread follows the squared
// relative deviation of each sample from the mean it found.
void BandwidthMeter::Update(TierBandwidth& t, uint64_t bytes, double seconds, double now) const {
  const double rate = static_cast<double>(bytes) / seconds;
  // How much of the old evidence time alone leaves (0: none before this sample).
  const double fade =
      t.samples == 0 ? 0 : std::exp2(-std::max(0.0, now - t.last_sample_s) / options_.half_life_s);
  if (t.samples == 0) {
    t.bytes_per_sec = rate;
  } else {
    const double keep = (1 - options_.alpha) * fade;
    const double dev = (rate - t.bytes_per_sec) / t.bytes_per_sec;
    t.bytes_per_sec = keep * t.bytes_per_sec + (1 - keep) * rate;
    const double var = keep * t.spread * t.spread + (1 - keep) * dev * dev;
    t.spread = std::min(options_.max_spread, std::sqrt(var));
  }
  // The fit needs Reads of different sizes, which come apart in time (one prompt's Reads are of
  // one size): its sums fade with time alone, each sample weighing 1.
  const double gb = static_cast<double>(bytes) / 1e9;
  t.w = fade * t.w + 1;
  t.wb = fade * t.wb + gb;
  t.ws = fade * t.ws + seconds;
  t.wbb = fade * t.wbb + gb * gb;
  t.wbs = fade * t.wbs + gb * seconds;
  if (rate >= DecayedBest(t, now)) {
    t.best_bytes_per_sec = rate;
    t.best_sample_s = now;
  }
  t.last_bytes_per_sec = rate;
  t.last_sample_s = now;
  ++t.samples;
  t.bytes += bytes;
  t.seconds += seconds;
}

void BandwidthMeter::Record(Tier tier, uint64_t bytes, double seconds) {
  if (bytes < options_.min_sample_bytes || !(seconds > 0)) return;
  const double now = Now();
  absl::MutexLock lock(&mu_);
  if (tier == Tier::kSsd && write_backlog_bytes_ > 0) {
    Update(contended_, bytes, seconds, now);
  } else {
    Update(tiers_[static_cast<int>(tier)], bytes, seconds, now);
  }
}

void BandwidthMeter::SetWriteBacklog(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  write_backlog_bytes_ = bytes;
}

BandwidthEstimate BandwidthMeter::EstimateOf(const TierBandwidth& t, double now,
                                             bool ssd_rule) const {
  BandwidthEstimate e;
  e.bytes_per_sec = t.bytes_per_sec;
  double spread = t.spread;
  if (t.samples > 0) {
    const double quiet = now - t.last_sample_s - options_.stale_after_s;
    spread += options_.stale_widen_per_s * std::max(0.0, quiet);
  }
  e.spread = std::min(options_.max_spread, spread);
  e.marginal_bytes_per_sec = t.bytes_per_sec;
  if (t.samples >= 2 && t.w > 0) {
    const double mb = t.wb / t.w, ms = t.ws / t.w;
    const double var = t.wbb / t.w - mb * mb, cov = t.wbs / t.w - mb * ms;
    const double cv = options_.min_size_cv;
    if (var > cv * cv * mb * mb && cov > 0) {
      const double slope = cov / var;  // seconds per GB
      const double fixed = ms - slope * mb;
      if (fixed > 0) {
        e.fixed_seconds = fixed;
        e.marginal_bytes_per_sec = 1e9 / slope;
      }
    }
  }
  e.low_bytes_per_sec = t.bytes_per_sec * (1 - e.spread);
  if (ssd_rule && t.samples > 0) {
    e.low_bytes_per_sec = std::min(e.low_bytes_per_sec, t.last_bytes_per_sec);
  } else if (!ssd_rule) {
    e.low_bytes_per_sec =
        std::max(e.low_bytes_per_sec, std::min(e.bytes_per_sec, DecayedBest(t, now)));
  }
  return e;
}

BandwidthEstimate BandwidthMeter::Estimate(Tier tier) const {
  const double now = Now();
  absl::MutexLock lock(&mu_);
  const TierBandwidth& alone = tiers_[static_cast<int>(tier)];
  const bool ssd = tier == Tier::kSsd;
  if (!ssd || write_backlog_bytes_ == 0) return EstimateOf(alone, now, ssd);
  BandwidthEstimate e;
  if (contended_.samples > 0) {
    e = EstimateOf(contended_, now, true);
  } else {
    // No read has run beside writes yet: the uncontended figures less the assumed share.
    e = EstimateOf(alone, now, true);
    e.bytes_per_sec *= 1 - options_.write_share_prior;
    e.low_bytes_per_sec *= 1 - options_.write_share_prior;
    e.marginal_bytes_per_sec *= 1 - options_.write_share_prior;
  }
  // Reads beside writes are never expected faster than alone.
  const BandwidthEstimate a = EstimateOf(alone, now, true);
  e.bytes_per_sec = std::min(e.bytes_per_sec, a.bytes_per_sec);
  e.low_bytes_per_sec = std::min(e.low_bytes_per_sec, a.low_bytes_per_sec);
  e.contended = true;
  return e;
}

double BandwidthMeter::BytesPerSecond(Tier tier) const { return Get(tier).bytes_per_sec; }

TierBandwidth BandwidthMeter::Get(Tier tier) const {
  absl::MutexLock lock(&mu_);
  return tiers_[static_cast<int>(tier)];
}

TierBandwidth BandwidthMeter::GetContended() const {
  absl::MutexLock lock(&mu_);
  return contended_;
}

}  // namespace tutti::datapath
