// The load-or-recompute advisor behind Lookup and ReportCompute: one compute model per namespace
// (tuttid runs one per GPU, so a namespace's model is its engine's rate on this GPU), the split
// chosen per Lookup (split.h), and the prediction error of the TTFTs engines report back.
//
// Advice is given only when asked (prompt_tokens > 0), when the advisor is enabled
// (datapath.decision "auto") and once the namespace has compute samples; otherwise every hit is
// to be loaded and nothing is predicted. Each decision gets an id (never 0) and is remembered,
// with its session, among the newest kMaxDecisions, so that a measured TTFT reported for it can be
// compared with the prediction.
//
// A namespace's compute model belongs to its owner (docs/decision.md "Who may feed a model"): the
// uid of the first session that reported samples into it. Samples from a session of any other uid
// are PERMISSION_DENIED and recorded nowhere, so another user cannot move the advice a namespace's
// engines get (with per-user namespaces only the owner's engines reach the namespace anyway; with
// namespaces shared across users, the first reporter's engines keep the model). A report of a
// measured TTFT alone (no samples) compares a decision of the caller's own session and is taken
// from any uid. Samples are bounded to physical values (ValidateReport) and, once the model has
// enough history, refused as outliers against it (ComputeModel::Outlier); either refusal is
// INVALID_ARGUMENT naming the sample and records nothing of the report.
//
// Robust advice (docs/decision.md "Robust advice"): each prediction carries an interval, from the
// bandwidths' pessimistic figures (Bandwidths::*_low) and the compute model's spread
// (ComputeModel::Spread), and the advice is the minimax-regret choice among recomputing, loading
// everything and the central best interior split (split.h, "The choice"). A measured TTFT reported
// by the model's owner corrects the side it measured at once, for prompts like it: a decision that
// recomputed scales the later TTFT(0) of the namespace's prompts of its size class (a power of two
// of tokens), one that loaded scales TTFT(k > 0) of its size class and share class (the quarter of
// the prompt loaded), apart for loads from the DRAM tier alone and loads that touch the SSD. Off
// by more than far_error, the scale is set so the same prediction would have been exact; nearer,
// it moves a third of the way. Corrections fade toward none with correction_half_life_s, so a
// device that recovers is tried again.
//
// Thread-safety: every method is thread-safe (one mutex; nothing is held across calls).
#ifndef TUTTI_DAEMON_DECISION_ADVISOR_H_
#define TUTTI_DAEMON_DECISION_ADVISOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/stats.h"
#include "common/types.h"
#include "daemon/decision/compute_model.h"
#include "daemon/decision/split.h"

namespace tutti::decision {

// Bounds of ReportCompute's input.
inline constexpr size_t kMaxSamplesPerReport = 1024;
inline constexpr uint32_t kMaxContextTokens = 1u << 24;
// Physical bounds of one sample: a layer's forward takes at most a minute, and between 1 ns and
// 1 s per new token (an H200 takes about 1.2 us per token of a 32K-token layer of an 8B model);
// the prefill's time outside the layers at most a minute; a measured TTFT at most an hour.
inline constexpr double kMaxLayerMs = 60'000;
inline constexpr double kMinLayerMsPerToken = 1e-6;
inline constexpr double kMaxLayerMsPerToken = 1'000;
inline constexpr double kMaxOverheadMs = 60'000;
inline constexpr double kMaxTtftMs = 3'600'000;

// What the split needs to know of a namespace.
struct NamespaceShape {
  uint32_t num_layers = 0;
  uint32_t block_tokens = 0;
  uint64_t layer_bytes = 0;  // one block's bytes of one layer (object_len x parts)
};

struct Bandwidths {
  double dram_bytes_per_sec = 0;
  double ssd_bytes_per_sec = 0;
  // The pessimistic figures (datapath::BandwidthEstimate::low_bytes_per_sec); 0: the above.
  double dram_low_bytes_per_sec = 0;
  double ssd_low_bytes_per_sec = 0;
  // A DRAM-only load's fixed part (datapath::BandwidthEstimate::fixed_seconds, in ms; 0: none);
  // where it is given, dram_bytes_per_sec is the marginal rate (SplitInput::dram_fixed_ms).
  double dram_fixed_ms = 0;
};

struct Advice {
  uint32_t load_blocks = 0;
  bool predicted = false;  // false: load_blocks = hits, the rest is 0
  double ttft_ms = 0, recompute_ms = 0, load_all_ms = 0;
  double ttft_low_ms = 0, ttft_high_ms = 0;  // ttft_ms's interval (Split)
  uint32_t refused_load_blocks = 0;           // Split::refused_load_blocks
  bool exploring = false;  // load_blocks is the refused central choice (explore_every_s)
  uint64_t decision_id = 0;
};

struct AdvisorOptions {
  bool enabled = true;
  double min_interior_gain = 0;  // SplitInput::min_interior_gain (datapath.decision_min_gain)
  // A measured TTFT off its prediction by more than this share corrects the model at once
  // (datapath.decision_far_error; in (0, 1]).
  double far_error = 0.1;
  double correction_half_life_s = 300;
  // Seconds on a monotonic clock; null: std::chrono::steady_clock.
  std::function<double()> clock;
  // Exploration: advice that would load but for its uncertainty recomputes, and a recompute reads
  // nothing, so the bandwidth meter would never learn the device is fast again (a slow read, a
  // quiet spell, the prior's spread would hold it off loading for good). At most once every
  // explore_every_s seconds such advice loads what the central prediction chose instead; its cost
  // is bounded by the interval's high end. 0: never.
  double explore_every_s = 30;
};

struct ReportResult {
  bool decision_found = false;
  double prediction_error = 0;  // |predicted - measured| / measured, when found
};

struct AdvisorStats {
  uint64_t decisions = 0;          // advice given with a prediction
  uint64_t prediction_errors = 0;  // measured TTFTs compared with their prediction
  double prediction_error_mean = 0;
  double prediction_error_last = 0;
  uint64_t corrections = 0;  // measured TTFTs far enough off to correct the model at once
  // Advice where the central best loaded but another candidate's worst-case regret was the least
  // (split.h): recomputing, or loading everything in place of a split.
  uint64_t refused_loads = 0;
  uint64_t explorations = 0;   // of those, advised to load anyway (AdvisorOptions::explore_every_s)
};

// INVALID_ARGUMENT naming the first bad field ("samples[3].layer_ms = nan: ..."): more than
// kMaxSamplesPerReport samples; new_tokens 0 or above context_tokens; context_tokens above
// kMaxContextTokens; layer_ms not finite, <= 0 or above kMaxLayerMs, or layer_ms / new_tokens
// outside [kMinLayerMsPerToken, kMaxLayerMsPerToken]; overhead_ms not finite, < 0 or above
// kMaxOverheadMs; decision_id and measured_ttft_ms not given together; measured_ttft_ms not
// finite, <= 0 or above kMaxTtftMs.
absl::Status ValidateReport(absl::Span<const ComputeSample> samples, uint64_t decision_id,
                            double measured_ttft_ms);

class Advisor {
 public:
  static constexpr size_t kMaxDecisions = 4096;
  // Bounds of a correction's scale.
  static constexpr double kMinCorrection = 0.25, kMaxCorrection = 4;

  explicit Advisor(AdvisorOptions options) : options_(std::move(options)) {}
  // `min_interior_gain`: SplitInput::min_interior_gain (config datapath.decision_min_gain).
  explicit Advisor(bool enabled, double min_interior_gain = 0)
      : Advisor(AdvisorOptions{enabled, min_interior_gain}) {}

  bool enabled() const { return options_.enabled; }

  // The split for a Lookup of `session` in `ns` whose hits lie in the tiers `hit_in_dram` says (one
  // per hit, chain order). Preconditions: shape fields >= 1, bandwidths > 0. With prompt_tokens 0,
  // the advisor off or no samples for `ns`: load_blocks = hits, predicted false, decision_id 0.
  Advice Advise(NamespaceId ns, uint64_t session, const NamespaceShape& shape,
                uint32_t prompt_tokens, const std::vector<bool>& hit_in_dram,
                const Bandwidths& bandwidths);

  // Adds `samples`, reported by `session` of user `uid`, to the model of `ns` (the first uid to
  // report samples into `ns` becomes the model's owner) and, with a decision_id, compares
  // measured_ttft_ms with that decision's prediction (found only if it was `session`'s and is
  // still remembered; then, if `uid` owns the model of `ns`, the measurement corrects it as the
  // file comment says). All or nothing: ValidateReport's errors; INVALID_ARGUMENT naming the first
  // sample that is an outlier against the model (ComputeModel::Outlier); PERMISSION_DENIED when
  // samples are given and the model belongs to another uid.
  absl::StatusOr<ReportResult> Report(NamespaceId ns, uint64_t session, uint32_t uid,
                                      absl::Span<const ComputeSample> samples, uint64_t decision_id,
                                      double measured_ttft_ms);

  AdvisorStats Stats() const;

 private:
  // Which correction a decision's measurement feeds.
  enum Side : uint8_t { kRecompute = 0, kLoadDram = 1, kLoadSsd = 2, kNumSides = 3 };
  // Corrections are kept per side, per class of prompt (SizeClass) and, for loads, per class of
  // the share loaded (split.h LoadShareClass): a measured TTFT corrects the predictions of
  // prompts like its own, not of those the model errs on otherwise. On the H200's DRAM grid
  // (2026-12-03, stop 36) one scale for every load from the DRAM tier swung from 0.52x to 1.35x
  // as the points changed, each point's first run correcting it for the next point's prompts.
  static constexpr uint32_t kSizeClasses = 25;  // floor(log2(prompt_tokens)); at most 2^24
  static uint32_t SizeClass(uint32_t prompt_tokens);  // prompt_tokens >= 1
  struct Decision {
    uint64_t session = 0;
    NamespaceId ns = 0;
    Side side = kRecompute;
    uint8_t size_class = 0;
    uint8_t share_class = 0;  // 0 for kRecompute
    double predicted_ttft_ms = 0;
  };
  // A multiplicative correction of one side's predictions, fading toward 1 from `at_s`.
  struct Correction {
    double log_scale = 0;
    double at_s = 0;
  };
  struct OwnedModel {
    uint32_t owner_uid = 0;  // the first uid that reported samples into it
    ComputeModel model;
    Correction corrections[kNumSides][kSizeClasses][kLoadShareClasses];
  };
  // PERMISSION_DENIED or the outlier's INVALID_ARGUMENT, as Report says; `model` may be null
  // (no samples yet: the caller becomes its owner).
  static absl::Status AdmitLocked(NamespaceId ns, uint32_t uid, const OwnedModel* model,
                                  absl::Span<const ComputeSample> samples);
  void RememberLocked(uint64_t id, Decision d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ReportResult CompareLocked(uint64_t session, uint32_t uid, uint64_t decision_id,
                            double measured_ttft_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The scale a correction stands at now, and the one that a measurement `ratio` (measured over
  // predicted) leaves.
  double ScaleNow(const Correction& c) const;
  // Returns whether the measurement was far off (corrected at once).
  bool Correct(Correction& c, double ratio) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double Now() const;

  const AdvisorOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<NamespaceId, OwnedModel> models_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Decision> decisions_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> decision_order_ ABSL_GUARDED_BY(mu_);  // oldest first
  uint64_t next_decision_id_ ABSL_GUARDED_BY(mu_) = 1;
  double last_explore_s_ ABSL_GUARDED_BY(mu_) = -1e300;  // Now() of the last exploration
  AdvisorStats stats_ ABSL_GUARDED_BY(mu_);
  double error_sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// The advisor's figures in the stats registry (common/stats.h): tutti_decision*, read from
// `stats` (Advisor::Stats) at each collection.
void RegisterAdvisorStats(std::function<AdvisorStats()> stats, stats::Registry* registry);

}  // namespace tutti::decision

#endif  // TUTTI_DAEMON_DECISION_ADVISOR_H_
