// KvCacheService's load-or-recompute part: the advice a Lookup answers, and ReportCompute.
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/server/kvcache_service.h"

namespace tutti::server {
namespace {

decision::ComputeSample FromProto(const tutti::v1::ComputeSample& s) {
  return {s.new_tokens(), s.context_tokens(), s.layer_ms(), s.overhead_ms()};
}

}  // namespace

void KvCacheService::AdviseLookup(const SessionState& session, uint32_t prompt_tokens,
                                  const std::vector<bool>& hit_in_dram,
                                  tutti::v1::LookupResponse* resp) {
  resp->set_load_blocks(resp->hits());
  if (prompt_tokens == 0 || !advisor_->enabled()) return;
  absl::StatusOr<store::NamespaceInfo> info = store_->GetNamespace(session.ns);
  if (!info.ok() || info->parts == 0) return;  // a session's namespace is registered
  const decision::NamespaceShape shape{info->num_objects / info->parts,
                                       info->descriptor.layout().block_tokens(),
                                       uint64_t{info->object_len} * info->parts};
  // As the device is now: the write backlog's share and the spread of the evidence included.
  const datapath::BandwidthMeter& meter = store_->read_bandwidth();
  const datapath::BandwidthEstimate dram = meter.Estimate(datapath::Tier::kDram);
  const datapath::BandwidthEstimate ssd = meter.Estimate(datapath::Tier::kSsd);
  decision::Bandwidths bandwidths{dram.bytes_per_sec, ssd.bytes_per_sec, dram.low_bytes_per_sec,
                                  ssd.low_bytes_per_sec};
  if (dram.fixed_seconds > 0) {
    // The DRAM tier's Reads have a fixed part: its bytes move at the marginal rate, and the
    // pessimistic figure keeps its relative distance from the mean (split.h).
    bandwidths.dram_bytes_per_sec = dram.marginal_bytes_per_sec;
    bandwidths.dram_low_bytes_per_sec =
        dram.low_bytes_per_sec * dram.marginal_bytes_per_sec / dram.bytes_per_sec;
    bandwidths.dram_fixed_ms = 1e3 * dram.fixed_seconds;
  }
  const decision::Advice advice =
      advisor_->Advise(session.ns, session.id, shape, prompt_tokens, hit_in_dram, bandwidths);
  resp->set_load_blocks(advice.load_blocks);
  if (!advice.predicted) return;
  resp->set_predicted_ttft_ms(advice.ttft_ms);
  resp->set_predicted_recompute_ms(advice.recompute_ms);
  resp->set_predicted_load_all_ms(advice.load_all_ms);
  resp->set_decision_id(advice.decision_id);
}

absl::Status KvCacheService::DoReportCompute(const tutti::v1::ReportComputeRequest& req,
                                             tutti::v1::ReportComputeResponse* resp) {
  ASSIGN_OR_RETURN(SessionCall call, EnterSession(req.session_id(), req.session_token()));
  if (req.samples_size() > static_cast<int>(decision::kMaxSamplesPerReport)) {
    return absl::InvalidArgumentError(absl::StrCat("samples: ", req.samples_size(),
                                                   " given, at most ",
                                                   decision::kMaxSamplesPerReport, " per call"));
  }
  std::vector<decision::ComputeSample> samples;
  samples.reserve(req.samples_size());
  for (const auto& s : req.samples()) samples.push_back(FromProto(s));
  const SessionState& session = *call.session();
  ASSIGN_OR_RETURN(decision::ReportResult result,
                   advisor_->Report(session.ns, session.id, session.uid, samples, req.decision_id(),
                                    req.measured_ttft_ms()));
  resp->set_decision_found(result.decision_found);
  resp->set_prediction_error(result.prediction_error);
  return absl::OkStatus();
}

grpc::Status KvCacheService::ReportCompute(grpc::ServerContext*,
                                           const tutti::v1::ReportComputeRequest* req,
                                           tutti::v1::ReportComputeResponse* resp) {
  return ServeCall(gate_, [&] { return DoReportCompute(*req, resp); });
}

}  // namespace tutti::server
