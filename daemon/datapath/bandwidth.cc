#include "daemon/datapath/bandwidth.h"

namespace tutti::datapath {

const char* TierName(Tier tier) { return tier == Tier::kDram ? "dram" : "ssd"; }

BandwidthMeter::BandwidthMeter(const BandwidthOptions& options) : options_(options) {
  tiers_[static_cast<int>(Tier::kDram)].bytes_per_sec = options.dram_prior_bytes_per_sec;
  tiers_[static_cast<int>(Tier::kSsd)].bytes_per_sec = options.ssd_prior_bytes_per_sec;
}

void BandwidthMeter::Record(Tier tier, uint64_t bytes, double seconds) {
  if (bytes < options_.min_sample_bytes || !(seconds > 0)) return;
  const double rate = static_cast<double>(bytes) / seconds;
  absl::MutexLock lock(&mu_);
  TierBandwidth& t = tiers_[static_cast<int>(tier)];
  t.bytes_per_sec =
      t.samples == 0 ? rate : options_.alpha * rate + (1 - options_.alpha) * t.bytes_per_sec;
  ++t.samples;
  t.bytes += bytes;
  t.seconds += seconds;
}

double BandwidthMeter::BytesPerSecond(Tier tier) const { return Get(tier).bytes_per_sec; }

TierBandwidth BandwidthMeter::Get(Tier tier) const {
  absl::MutexLock lock(&mu_);
  return tiers_[static_cast<int>(tier)];
}

}  // namespace tutti::datapath
