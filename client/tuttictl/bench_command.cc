// tuttictl bench: acts as an engine in host mode (a paged KV cache in POSIX shared memory),
// stores deterministic blocks, then looks them up, retrieves them into other engine blocks and
// verifies them, and reports bandwidth and Lookup latency.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/hostengine/content.h"
#include "client/hostengine/engine_client.h"
#include "client/hostengine/host_engine.h"
#include "client/hostengine/workload.h"
#include "client/tuttictl/command.h"
#include "client/tuttictl/output.h"
#include "common/connect.h"
#include "common/status_macros.h"

namespace tutti::tuttictl {
namespace {

using hostengine::KvShape;
using hostengine::RetrieveTally;
using hostengine::StoreTally;

constexpr uint64_t kMaxShmBytes = 4ull << 30;

struct BenchResult {
  bool stored = false, retrieved = false;
  StoreTally store;
  RetrieveTally retrieve;
  absl::Duration store_wall, retrieve_wall;
};

double GBps(uint64_t bytes, absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  return s > 0 ? bytes / s / 1e9 : 0;
}

class BenchCommand : public Command {
 public:
  std::string name() const override { return "bench"; }
  std::string usage() const override {
    return "bench [--blocks N] [--seed S] [--phase store|retrieve|both] [--verify] [...]";
  }
  std::string summary() const override {
    return "act as a host-mode engine: store, retrieve and verify blocks; print GB/s and "
           "Lookup latency";
  }
  void RegisterFlags(FlagSet& f) override {
    f.Uint32("blocks", &blocks_, "blocks (keys) to store and retrieve");
    f.Uint64("seed", &seed_, "seed of the key chain and content; reuse it to verify later");
    f.String("phase", &phase_, "store, retrieve or both");
    f.Bool("verify", &verify_, "compare every retrieved byte; exit 1 on any miss or mismatch");
    f.Uint32("engine_blocks", &engine_blocks_,
             "engine KV blocks in shared memory (0: = --blocks, capped at 4 GiB of memory)");
    f.Uint32("batch", &batch_, "blocks per Lookup, Retrieve and Store call");
    f.Uint32("layers", &shape_.layers, "layers");
    f.Uint32("kv_heads", &shape_.kv_heads, "KV heads");
    f.Uint32("head_dim", &shape_.head_dim, "head dimension");
    f.Uint32("block_tokens", &shape_.block_tokens, "tokens per block");
    f.Uint32("dtype_bytes", &shape_.dtype_bytes, "bytes per element");
    f.String("model_id", &identity_.model_id, "namespace model id");
  }
  absl::Status CheckUsage(const FlagSet& flags, const std::vector<std::string>& args) override;
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override;

 private:
  absl::StatusOr<BenchResult> RunPhases(const GlobalOptions& options, std::ostream& out);
  void PrintHuman(const BenchResult& r, std::ostream& out) const;
  void PrintJson(const BenchResult& r, std::ostream& out) const;
  absl::Status Verdict(const BenchResult& r) const;

  uint32_t blocks_ = 256, engine_blocks_ = 0, batch_ = 64;
  uint64_t seed_ = 1;
  std::string phase_ = "both";
  bool verify_ = false;
  KvShape shape_ = KvShape::Llama3_8B();
  hostengine::EngineIdentity identity_;
  std::string note_;
};

absl::Status BenchCommand::CheckUsage(const FlagSet& flags, const std::vector<std::string>& args) {
  RETURN_IF_ERROR(Command::CheckUsage(flags, args));
  if (phase_ != "store" && phase_ != "retrieve" && phase_ != "both") {
    return absl::InvalidArgumentError("--phase must be store, retrieve or both");
  }
  if (blocks_ == 0) return absl::InvalidArgumentError("--blocks must be > 0");
  if (batch_ == 0) return absl::InvalidArgumentError("--batch must be > 0");
  if (absl::Status s = shape_.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  const uint64_t cap = kMaxShmBytes / shape_.block_bytes();
  if (cap == 0) return absl::InvalidArgumentError("one block is larger than 4 GiB");
  const uint32_t wanted = engine_blocks_ == 0 ? blocks_ : engine_blocks_;
  engine_blocks_ = static_cast<uint32_t>(std::min<uint64_t>(wanted, cap));
  if (engine_blocks_ < wanted) {
    note_ = absl::StrCat("engine blocks capped at ", engine_blocks_, " (4 GiB of shared memory)");
  }
  batch_ = std::min(batch_, engine_blocks_);
  return absl::OkStatus();
}

absl::StatusOr<BenchResult> BenchCommand::RunPhases(const GlobalOptions& options,
                                                    std::ostream& out) {
  ShmRegion::UnlinkOnFatalSignals();
  ASSIGN_OR_RETURN(auto engine,
                   hostengine::HostEngine::Create(shape_, engine_blocks_, "tutti-bench"));
  ASSIGN_OR_RETURN(auto channel, ConnectToTuttid(
                                     options.socket, absl::Milliseconds(options.timeout_ms)));
  hostengine::EngineClient client(channel, options.socket);
  identity_.engine_id = absl::StrCat("tuttictl-bench pid ", getpid());
  auto attach = client.Attach(engine->MakeAttachRequest(identity_), engine->fds());
  if (!attach.ok()) {
    return absl::Status(attach.status().code(),
                        absl::StrCat("Attach: tuttid: ", attach.status().message()));
  }
  engine->region().Unlink();  // tuttid has it mapped; nothing is left behind from here on
  const uint32_t batch = std::min(batch_, std::max(1u, attach->max_blocks_per_call()));
  if (!options.json) {
    out << "bench: " << blocks_ << " blocks of " << HumanBytes(shape_.block_bytes()) << " ("
        << shape_.Describe() << "), seed " << seed_ << ", batch " << batch << ", " << engine_blocks_
        << " engine blocks; session " << attach->session_id() << ", namespace "
        << NamespaceHex(attach->namespace_id()) << "\n";
    if (!note_.empty()) out << "note: " << note_ << "\n";
  }
  const auto keys = hostengine::MakeKeyChain(seed_, blocks_);
  BenchResult r;
  if (phase_ != "retrieve") {
    hostengine::StoreOptions so;
    so.batch = batch;
    const absl::Time t0 = absl::Now();
    r.store = hostengine::StoreKeys(client, *engine, keys, so);
    r.store_wall = absl::Now() - t0;
    r.stored = true;
    RETURN_IF_ERROR(r.store.status);
  }
  if (phase_ != "store") {
    hostengine::RetrieveOptions ro;
    ro.batch = batch;
    ro.verify = verify_;
    ro.shuffle_seed = seed_ ^ 0x5eed5eed5eedull;
    const absl::Time t0 = absl::Now();
    r.retrieve = hostengine::RetrieveKeys(client, *engine, keys, ro);
    r.retrieve_wall = absl::Now() - t0;
    r.retrieved = true;
    RETURN_IF_ERROR(r.retrieve.status);
  }
  (void)client.Detach();
  return r;
}

absl::Status BenchCommand::Run(const GlobalOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(const BenchResult r, RunPhases(options, out));
  if (options.json) {
    PrintJson(r, out);
  } else {
    PrintHuman(r, out);
  }
  return Verdict(r);
}

void BenchCommand::PrintHuman(const BenchResult& r, std::ostream& out) const {
  Table t({"PHASE", ">BLOCKS", ">BYTES", ">RPC SECONDS", ">GB/S", ">WALL SECONDS"});
  if (r.stored) {
    const uint64_t n = r.store.captured + r.store.durable;
    t.AddRow({"store", absl::StrCat(n), HumanBytes(r.store.bytes),
              absl::StrFormat("%.3f", absl::ToDoubleSeconds(r.store.rpc_time)),
              absl::StrFormat("%.2f", GBps(r.store.bytes, r.store.rpc_time)),
              absl::StrFormat("%.3f", absl::ToDoubleSeconds(r.store_wall))});
  }
  if (r.retrieved) {
    const uint64_t n = r.retrieve.hits + r.retrieve.mismatched_blocks;
    t.AddRow({"retrieve", absl::StrCat(n), HumanBytes(r.retrieve.bytes),
              absl::StrFormat("%.3f", absl::ToDoubleSeconds(r.retrieve.rpc_time)),
              absl::StrFormat("%.2f", GBps(r.retrieve.bytes, r.retrieve.rpc_time)),
              absl::StrFormat("%.3f", absl::ToDoubleSeconds(r.retrieve_wall))});
  }
  out << "\n" << t.Render() << "\n";
  KeyValues kv;
  if (r.stored) {
    const StoreTally& s = r.store;
    kv.Add("store outcomes",
           absl::StrCat("durable ", s.durable, ", captured ", s.captured, ", already present ",
                        s.already_present, ", rejected (full) ", s.rejected_full, ", failed ",
                        s.failed,
                        s.declined > 0 ? absl::StrCat(", declined (admission) ", s.declined)
                                       : std::string(),
                        s.in_dram > 0 ? absl::StrCat(", in DRAM only (dram_front) ", s.in_dram)
                                      : std::string()));
  }
  if (r.retrieved) {
    const RetrieveTally& x = r.retrieve;
    kv.Add("lookup latency",
           absl::StrFormat("p50 %.0f us, p99 %.0f us (%d calls)",
                           hostengine::Quantile(x.lookup_us, 0.5),
                           hostengine::Quantile(x.lookup_us, 0.99), x.lookup_us.size()));
    kv.Add("retrieve",
           absl::StrCat("hits ", x.hits, ", misses ", x.misses, ", failed ", x.failed,
                        ", mismatches ", x.mismatched_blocks, " blocks (", x.mismatched_bytes,
                        " bytes)", verify_ ? "" : "; not verified (add --verify)"));
    if (x.progress_errors > 0) {
      kv.Add("stream errors", absl::StrCat(x.progress_errors, " progress streams out of order"));
    }
  }
  out << kv.Render();
}

void BenchCommand::PrintJson(const BenchResult& r, std::ostream& out) const {
  JsonWriter j;
  j.BeginObject().Key("blocks").Uint(blocks_).Key("block_bytes").Uint(shape_.block_bytes());
  j.Key("seed").Uint(seed_).Key("engine_blocks").Uint(engine_blocks_).Key("verify").Bool(verify_);
  if (r.stored) {
    const StoreTally& s = r.store;
    j.Key("store").BeginObject().Key("bytes").Uint(s.bytes);
    j.Key("rpc_seconds").Double(absl::ToDoubleSeconds(s.rpc_time));
    j.Key("wall_seconds").Double(absl::ToDoubleSeconds(r.store_wall));
    j.Key("gbps").Double(GBps(s.bytes, s.rpc_time)).Key("durable").Uint(s.durable);
    j.Key("captured").Uint(s.captured).Key("already_present").Uint(s.already_present);
    j.Key("rejected_full").Uint(s.rejected_full).Key("failed").Uint(s.failed);
    j.Key("declined").Uint(s.declined).Key("in_dram").Uint(s.in_dram).EndObject();
  }
  if (r.retrieved) {
    const RetrieveTally& x = r.retrieve;
    j.Key("retrieve").BeginObject().Key("bytes").Uint(x.bytes);
    j.Key("rpc_seconds").Double(absl::ToDoubleSeconds(x.rpc_time));
    j.Key("wall_seconds").Double(absl::ToDoubleSeconds(r.retrieve_wall));
    j.Key("gbps").Double(GBps(x.bytes, x.rpc_time));
    j.Key("lookup_p50_us").Double(hostengine::Quantile(x.lookup_us, 0.5));
    j.Key("lookup_p99_us").Double(hostengine::Quantile(x.lookup_us, 0.99));
    j.Key("hits").Uint(x.hits).Key("misses").Uint(x.misses).Key("failed").Uint(x.failed);
    j.Key("mismatched_blocks").Uint(x.mismatched_blocks);
    j.Key("mismatched_bytes").Uint(x.mismatched_bytes);
    j.Key("progress_errors").Uint(x.progress_errors).EndObject();
  }
  j.Key("ok").Bool(Verdict(r).ok()).EndObject();
  out << j.str() << "\n";
}

absl::Status BenchCommand::Verdict(const BenchResult& r) const {
  std::string problems;
  if (r.stored && r.store.failed + r.store.rejected_full > 0) {
    absl::StrAppend(&problems, r.store.failed, " blocks failed to store, ", r.store.rejected_full,
                    " rejected (staging full); ");
  }
  const RetrieveTally& x = r.retrieve;
  if (r.retrieved && x.progress_errors > 0) {
    absl::StrAppend(&problems, x.progress_errors, " progress streams out of order; ");
  }
  if (r.retrieved && verify_ && x.misses + x.failed + x.mismatched_blocks > 0) {
    absl::StrAppend(&problems, "verify failed: ", x.misses, " misses, ", x.failed,
                    " failed blocks, ", x.mismatched_blocks, " mismatched blocks (",
                    x.mismatched_bytes, " bytes); ");
  }
  if (problems.empty()) return absl::OkStatus();
  problems.resize(problems.size() - 2);
  return absl::DataLossError(problems);
}

}  // namespace

std::unique_ptr<Command> NewBenchCommand() { return std::make_unique<BenchCommand>(); }

}  // namespace tutti::tuttictl
