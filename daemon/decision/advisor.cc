#include "daemon/decision/advisor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "daemon/decision/split.h"

namespace tutti::decision {
namespace {

absl::Status Bad(const std::string& field, double value, const char* allowed) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, ": ", allowed));
}

absl::Status ValidateSample(size_t i, const ComputeSample& s) {
  const std::string field = absl::StrCat("samples[", i, "]");
  if (s.context_tokens > kMaxContextTokens) {
    return Bad(field + ".context_tokens", s.context_tokens,
               absl::StrCat("must be at most ", kMaxContextTokens).c_str());
  }
  if (s.new_tokens == 0 || s.new_tokens > s.context_tokens) {
    return Bad(field + ".new_tokens", s.new_tokens,
               "must be in [1, context_tokens] (context_tokens counts the new tokens too)");
  }
  if (!std::isfinite(s.layer_ms) || s.layer_ms <= 0 || s.layer_ms > kMaxLayerMs) {
    return Bad(
        field + ".layer_ms", s.layer_ms,
        absl::StrCat("must be > 0 and at most ", kMaxLayerMs, " (a minute per layer)").c_str());
  }
  const double per_token = s.layer_ms / s.new_tokens;
  if (per_token < kMinLayerMsPerToken || per_token > kMaxLayerMsPerToken) {
    return Bad(
        field + ".layer_ms", s.layer_ms,
        absl::StrCat("is ", per_token, " ms per new token (", s.new_tokens, "); must be in [",
                     kMinLayerMsPerToken, ", ", kMaxLayerMsPerToken, "] ms per token and layer")
            .c_str());
  }
  if (!std::isfinite(s.overhead_ms) || s.overhead_ms < 0 || s.overhead_ms > kMaxOverheadMs) {
    return Bad(field + ".overhead_ms", s.overhead_ms,
               absl::StrCat("must be >= 0 and at most ", kMaxOverheadMs, " (a minute)").c_str());
  }
  return absl::OkStatus();
}

// The candidates of the choice (split.h), as the refusal line gives them: "k: predicted [low,
// high] ms, worst-case regret r" each, simplest first.
std::string CandidatesText(const Split& split) {
  std::string text;
  for (uint32_t i = 0; i < split.num_candidates; ++i) {
    const SplitCandidate& c = split.candidates[i];
    absl::StrAppend(&text, i > 0 ? "; " : "",
                    absl::StrFormat("%u: %.1f [%.1f, %.1f] ms, worst-case regret %.3f",
                                    c.load_blocks, c.ttft_ms, c.low_ms, c.high_ms, c.regret));
  }
  return text;
}

}  // namespace

absl::Status ValidateReport(absl::Span<const ComputeSample> samples, uint64_t decision_id,
                            double measured_ttft_ms) {
  if (samples.size() > kMaxSamplesPerReport) {
    return absl::InvalidArgumentError(absl::StrCat("samples: ", samples.size(), " given, at most ",
                                                   kMaxSamplesPerReport, " per call"));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    if (absl::Status s = ValidateSample(i, samples[i]); !s.ok()) return s;
  }
  if ((decision_id == 0) != (measured_ttft_ms == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("decision_id = ", decision_id, ", measured_ttft_ms = ", measured_ttft_ms,
                     ": give both (the TTFT measured after that decision) or neither"));
  }
  if (decision_id != 0 && (!std::isfinite(measured_ttft_ms) || measured_ttft_ms <= 0 ||
                           measured_ttft_ms > kMaxTtftMs)) {
    return Bad("measured_ttft_ms", measured_ttft_ms,
               absl::StrCat("must be > 0 and at most ", kMaxTtftMs, " (an hour)").c_str());
  }
  return absl::OkStatus();
}

Advice Advisor::Advise(NamespaceId ns, uint64_t session, const NamespaceShape& shape,
                       uint32_t prompt_tokens, const std::vector<bool>& hit_in_dram,
                       const Bandwidths& bandwidths) {
  Advice advice;
  advice.load_blocks = static_cast<uint32_t>(hit_in_dram.size());
  if (!options_.enabled || prompt_tokens == 0) return advice;
  absl::MutexLock lock(&mu_);
  auto it = models_.find(ns);
  if (it == models_.end() || it->second.model.empty()) return advice;
  const OwnedModel& owned = it->second;
  const ComputeModel& model = owned.model;
  SplitInput in;
  in.num_layers = shape.num_layers;
  in.block_tokens = shape.block_tokens;
  in.prompt_tokens = prompt_tokens;
  in.layer_bytes = shape.layer_bytes;
  in.hit_in_dram = hit_in_dram;
  in.dram_bytes_per_sec = bandwidths.dram_bytes_per_sec;
  in.ssd_bytes_per_sec = bandwidths.ssd_bytes_per_sec;
  in.dram_low_bytes_per_sec = bandwidths.dram_low_bytes_per_sec;
  in.ssd_low_bytes_per_sec = bandwidths.ssd_low_bytes_per_sec;
  in.dram_fixed_ms = bandwidths.dram_fixed_ms;
  in.overhead_ms = model.OverheadMs();
  in.min_interior_gain = options_.min_interior_gain;
  in.recompute_spread = model.Spread(false);
  in.load_compute_spread = model.Spread(true);
  const uint32_t size = SizeClass(prompt_tokens);
  in.recompute_scale = ScaleNow(owned.corrections[kRecompute][size][0]);
  // A load that touches the SSD is paced by it; one from the DRAM tier alone is corrected apart.
  const bool any_ssd =
      std::find(hit_in_dram.begin(), hit_in_dram.end(), false) != hit_in_dram.end();
  for (uint32_t share = 0; share < kLoadShareClasses; ++share) {
    in.load_scales[share] =
        ScaleNow(owned.corrections[any_ssd ? kLoadSsd : kLoadDram][size][share]);
  }
  in.layer_ms = [&model](uint32_t t, uint32_t k) { return model.LayerMs(t, k).value_or(0); };
  Split split = ChooseSplit(in);
  if (split.refused_load_blocks > 0) {
    // Why a load that wins centrally was not advised: the operator's (and the grid's) evidence.
    TUTTI_LOG_EVERY_N_SEC(
        log::Get("decision"), spdlog::level::info, 1,
        "namespace {:016x}: loading {} of {} hits (predicted {:.1f} ms, high end {:.1f}) refused "
        "for its uncertainty; advised {} instead (predicted {:.1f} ms, {:.1f}-{:.1f}; "
        "recomputing {:.1f}); minimax regret over the candidates {}; "
        "DRAM {:.2f} GB/s (low {:.2f}, fixed {:.1f} ms), SSD {:.2f} GB/s (low {:.2f}), "
        "compute spread {:.3f} / {:.3f} (plain / prefixed, of {} / {} samples, {} / {} trimmed), "
        "scales {:.3f} / {:.3f} (recompute / load)",
        ns, split.refused_load_blocks, hit_in_dram.size(),
        LoadScale(in, split.refused_load_blocks) * PredictTtftMs(in, split.refused_load_blocks),
        split.refused_high_ms,
        split.load_blocks, split.ttft_ms, split.ttft_low_ms, split.ttft_high_ms,
        split.recompute_ms, CandidatesText(split), in.dram_bytes_per_sec / 1e9,
        in.dram_low_bytes_per_sec / 1e9, in.dram_fixed_ms, in.ssd_bytes_per_sec / 1e9,
        in.ssd_low_bytes_per_sec / 1e9, in.recompute_spread, in.load_compute_spread,
        model.Samples(false), model.Samples(true), model.Trimmed(false), model.Trimmed(true),
        in.recompute_scale, LoadScale(in, split.refused_load_blocks));
  }
  bool exploring = false;
  if (split.refused_load_blocks > 0 && options_.explore_every_s > 0) {
    const double now = Now();
    if (now - last_explore_s_ >= options_.explore_every_s) {
      // The central choice, predicted as ChooseSplit predicts it (with the load side's scale).
      last_explore_s_ = now;
      exploring = true;
      split.load_blocks = split.refused_load_blocks;
      split.ttft_ms = LoadScale(in, split.load_blocks) * PredictTtftMs(in, split.load_blocks);
    }
  }
  advice = Advice{split.load_blocks,      true,        split.ttft_ms,
                  split.recompute_ms,     split.load_all_ms, split.ttft_low_ms,
                  split.ttft_high_ms,     split.refused_load_blocks, exploring,
                  next_decision_id_++};
  Side side = kRecompute;
  uint32_t share = 0;
  if (split.load_blocks > 0) {
    const bool ssd = std::find(hit_in_dram.begin(), hit_in_dram.begin() + split.load_blocks,
                               false) != hit_in_dram.begin() + split.load_blocks;
    side = ssd ? kLoadSsd : kLoadDram;
    share = LoadShareClass(in, split.load_blocks);
  }
  RememberLocked(advice.decision_id, Decision{session, ns, side, static_cast<uint8_t>(size),
                                              static_cast<uint8_t>(share), split.ttft_ms});
  // Every decision with what it saw, at debug: the evidence for a point that went the wrong way
  // (`tests/e2e/ttft_grid.py --advice-log` prints these beside each run).
  if (const auto logger = log::Get("decision"); logger->should_log(spdlog::level::debug)) {
    const uint32_t kmax = split.max_load_blocks;
    logger->debug(
        "namespace {:016x}: decision {} advised {} of {} hits for {} tokens (predicted {:.1f} ms, "
        "{:.1f}-{:.1f}; recomputing {:.1f}, loading {} {:.1f}); DRAM {:.2f} GB/s (low {:.2f}, "
        "fixed {:.1f} ms), SSD {:.2f} GB/s (low {:.2f}); compute {:.3f} / {:.3f} ms a layer "
        "(recomputing / loading {}), spreads {:.3f} / {:.3f}, overhead {:.1f} ms; scales {:.3f} / "
        "{:.3f} (recompute / load); candidates {}",
        ns, advice.decision_id, split.load_blocks, hit_in_dram.size(), prompt_tokens,
        split.ttft_ms, split.ttft_low_ms, split.ttft_high_ms, split.recompute_ms, kmax,
        split.load_all_ms, in.dram_bytes_per_sec / 1e9, in.dram_low_bytes_per_sec / 1e9,
        in.dram_fixed_ms, in.ssd_bytes_per_sec / 1e9, in.ssd_low_bytes_per_sec / 1e9,
        in.layer_ms(prompt_tokens, 0), in.layer_ms(prompt_tokens, kmax * in.block_tokens), kmax,
        in.recompute_spread, in.load_compute_spread, in.overhead_ms, in.recompute_scale,
        kmax > 0 ? LoadScale(in, kmax) : 1.0, CandidatesText(split));
  }
  ++stats_.decisions;
  stats_.refused_loads += split.refused_load_blocks > 0 && !exploring;
  stats_.explorations += exploring;
  return advice;
}

uint32_t Advisor::SizeClass(uint32_t prompt_tokens) {
  return std::min<uint32_t>(kSizeClasses - 1,
                            31 - static_cast<uint32_t>(__builtin_clz(prompt_tokens)));
}

double Advisor::Now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Advisor::ScaleNow(const Correction& c) const {
  if (c.log_scale == 0) return 1;
  const double age = std::max(0.0, Now() - c.at_s);
  return std::exp(c.log_scale * std::exp2(-age / options_.correction_half_life_s));
}

bool Advisor::Correct(Correction& c, double ratio) {
  const double now_log = std::log(ScaleNow(c));
  const double far = std::fabs(ratio - 1) > options_.far_error;
  // Far off: at once, so that the same prediction would have been exact; near: a third of it.
  double log_scale = now_log + (far ? 1.0 : 1.0 / 3) * std::log(ratio);
  log_scale = std::clamp(log_scale, std::log(kMinCorrection), std::log(kMaxCorrection));
  c = Correction{log_scale, Now()};
  stats_.corrections += far;
  return far;
}

void Advisor::RememberLocked(uint64_t id, Decision d) {
  decisions_[id] = d;
  decision_order_.push_back(id);
  if (decision_order_.size() > kMaxDecisions) {
    decisions_.erase(decision_order_.front());
    decision_order_.pop_front();
  }
}

absl::Status Advisor::AdmitLocked(NamespaceId ns, uint32_t uid, const OwnedModel* model,
                                  absl::Span<const ComputeSample> samples) {
  if (model == nullptr) return absl::OkStatus();
  if (model->owner_uid != uid) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "the compute model of namespace %016x belongs to the user whose engines first reported "
        "into it; samples of uid %u are not recorded",
        ns, uid));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    const std::optional<double> predicted = model->model.Outlier(samples[i]);
    if (!predicted.has_value()) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("samples[", i, "].layer_ms = ", samples[i].layer_ms, ": more than ",
                     ComputeModel::kOutlierFactor, "x off the model's prediction of ", *predicted,
                     " ms for ", samples[i].new_tokens, " of ", samples[i].context_tokens,
                     " tokens (an outlier); nothing of this report is recorded"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReportResult> Advisor::Report(NamespaceId ns, uint64_t session, uint32_t uid,
                                             absl::Span<const ComputeSample> samples,
                                             uint64_t decision_id, double measured_ttft_ms) {
  if (absl::Status s = ValidateReport(samples, decision_id, measured_ttft_ms); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (!samples.empty()) {
    auto it = models_.find(ns);
    const OwnedModel* existing = it == models_.end() ? nullptr : &it->second;
    if (absl::Status s = AdmitLocked(ns, uid, existing, samples); !s.ok()) return s;
    OwnedModel& owned = models_[ns];
    if (existing == nullptr) owned.owner_uid = uid;
    for (const ComputeSample& s : samples) owned.model.Add(s);
  }
  if (decision_id == 0) return ReportResult{};
  return CompareLocked(session, uid, decision_id, measured_ttft_ms);
}

ReportResult Advisor::CompareLocked(uint64_t session, uint32_t uid, uint64_t decision_id,
                                    double measured_ttft_ms) {
  auto it = decisions_.find(decision_id);
  if (it == decisions_.end() || it->second.session != session) return ReportResult{};
  const Decision d = it->second;
  const double error = std::fabs(d.predicted_ttft_ms - measured_ttft_ms) / measured_ttft_ms;
  decisions_.erase(it);
  // Only the model's owner corrects it (issue 19: another uid must not move the owner's advice).
  if (auto m = models_.find(d.ns); m != models_.end() && m->second.owner_uid == uid) {
    Correction& c = m->second.corrections[d.side][d.size_class][d.share_class];
    if (Correct(c, measured_ttft_ms / d.predicted_ttft_ms)) {
      // Rare by design (a device or engine that changed): the operator's evidence of it.
      static constexpr const char* kSideNames[kNumSides] = {
          "recomputing", "loading from the DRAM tier", "loading from the SSD"};
      TUTTI_LOG_EVERY_N_SEC(log::Get("decision"), spdlog::level::info, 1,
                            "namespace {:016x}: a measured TTFT of {:.1f} ms against {:.1f} "
                            "predicted ({}) corrected the model at once: such predictions are "
                            "now scaled {:.3f}x",
                            d.ns, measured_ttft_ms, d.predicted_ttft_ms, kSideNames[d.side],
                            std::exp(c.log_scale));
    }
  }  // one measurement per decision; its id leaves decision_order_ later
  ++stats_.prediction_errors;
  error_sum_ += error;
  stats_.prediction_error_mean = error_sum_ / stats_.prediction_errors;
  stats_.prediction_error_last = error;
  return ReportResult{true, error};
}

AdvisorStats Advisor::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void RegisterAdvisorStats(std::function<AdvisorStats()> stats, stats::Registry* registry) {
  registry->AddGroup<AdvisorStats>(std::move(stats))
      .Counter("tutti_decisions_total", "Load-or-recompute advice given with a prediction.",
               [](const AdvisorStats& d) { return d.decisions; }, "decisions")
      .Counter("tutti_decision_predictions_checked_total", "Measured TTFTs compared with their "
               "prediction.", [](const AdvisorStats& d) { return d.prediction_errors; },
               "prediction_errors")
      .Gauge("tutti_decision_prediction_error_mean", "Mean relative error of the predicted TTFT.",
             [](const AdvisorStats& d) { return d.prediction_error_mean; },
             "prediction_error_mean")
      .Gauge("tutti_decision_prediction_error_last", "Relative error of the last predicted TTFT "
             "checked.", [](const AdvisorStats& d) { return d.prediction_error_last; },
             "prediction_error_last")
      .Counter("tutti_decision_corrections_total", "Measured TTFTs far enough off their "
               "prediction to correct the model at once.",
               [](const AdvisorStats& d) { return d.corrections; }, "decision_corrections")
      .Add({"tutti_decision_refused_loads_total", "Advice where the central best loaded but "
            "another candidate's worst-case regret was the least: that candidate advised, or the "
            "central best loaded anyway to explore.",
            stats::Type::kCounter, {"advised"}},
           [](const AdvisorStats& d, stats::Samples* out) {
             out->Add({"recompute"}, d.refused_loads, "decision_refused_loads");
             out->Add({"explore"}, d.explorations, "decision_explorations");
           });
}

}  // namespace tutti::decision
