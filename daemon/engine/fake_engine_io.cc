#include "daemon/engine/fake_engine_io.h"

#include <utility>

#include "common/status_macros.h"

namespace tutti::engine {
namespace {

using Call = FakeEngineLog::Call;

// The newer of two tickets, wrap-around safe (as the cuda EngineIo compares).
uint32_t Newer(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0 ? a : b; }

class FakeEngineIo final : public EngineIo {
 public:
  FakeEngineIo(FakeEngineOptions options, std::unique_ptr<EngineIo> inner, FakeEngineLog* log)
      : options_(std::move(options)), inner_(std::move(inner)), log_(log) {}

  std::string_view kind() const override { return options_.kind; }
  uint32_t num_blocks() const override {
    return inner_ != nullptr ? inner_->num_blocks() : options_.num_blocks;
  }
  bool is_device() const override { return options_.is_device; }
  bool has_ready_words() const override { return options_.has_ready_words; }

  absl::Status ScatterLayer(uint32_t layer, absl::Span<const CopyOp> ops,
                            uint32_t ticket) override {
    RETURN_IF_ERROR(Record({Call::kScatter, layer, 0, ticket, {ops.begin(), ops.end()}}));
    return Scatter(layer, ops, ticket);
  }
  absl::Status EnqueueLayer(uint32_t layer, absl::Span<const CopyOp> ops,
                            uint32_t ticket) override {
    RETURN_IF_ERROR(Record({Call::kEnqueue, layer, 0, ticket, {ops.begin(), ops.end()}}));
    {
      absl::MutexLock lock(&log_->mu);
      log_->enqueued.push_back(layer);
    }
    return Scatter(layer, ops, ticket);
  }
  absl::Status Drain() override {
    RETURN_IF_ERROR(Record({Call::kDrain}));
    absl::MutexLock lock(&log_->mu);
    ++log_->drains;
    return absl::OkStatus();
  }
  absl::Status SignalLayers(uint32_t begin, uint32_t end, uint32_t ticket) override {
    RETURN_IF_ERROR(Record({Call::kSignalLayers, begin, end, ticket}));
    if (!options_.has_ready_words) return absl::OkStatus();
    for (uint32_t l = begin; l < end && l < options_.num_layers; ++l) log_->Add(l, ticket);
    return absl::OkStatus();
  }
  absl::Status Gather(absl::Span<const CopyOp> ops) override {
    RETURN_IF_ERROR(Record({Call::kGather, 0, 0, 0, {ops.begin(), ops.end()}}));
    {
      absl::MutexLock lock(&log_->mu);
      if (!log_->gather_error.ok()) return log_->gather_error;
    }
    return inner_ != nullptr ? inner_->Gather(ops) : absl::OkStatus();
  }
  absl::Status SignalCaptured(uint32_t ticket) override {
    RETURN_IF_ERROR(Record({Call::kSignalCaptured, 0, 0, ticket}));
    if (!options_.has_ready_words) return absl::OkStatus();
    uint32_t word_ticket;
    {
      absl::MutexLock lock(&mu_);
      last_store_ticket_ = stored_before_ ? Newer(ticket, last_store_ticket_) : ticket;
      stored_before_ = true;
      word_ticket = last_store_ticket_;
    }
    log_->Add(options_.num_layers, word_ticket);
    return absl::OkStatus();
  }
  void Close() override {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
    }
    {
      absl::MutexLock lock(&log_->mu);
      log_->calls.push_back({Call::kClose});
    }
    if (inner_ != nullptr) inner_->Close();
  }

 private:
  // Appends `call` to the log (also after Close, so a test sees calls made too late); CANCELLED
  // once closed.
  absl::Status Record(Call call) {
    bool closed;
    {
      absl::MutexLock lock(&mu_);
      closed = closed_;
    }
    absl::MutexLock lock(&log_->mu);
    log_->calls.push_back(std::move(call));
    return closed ? absl::CancelledError("the session was closed") : absl::OkStatus();
  }

  // The copy of ScatterLayer and EnqueueLayer: the hold, the injected error, the inner copy, then
  // the layer's word.
  absl::Status Scatter(uint32_t layer, absl::Span<const CopyOp> ops, uint32_t ticket) {
    if (absl::Notification* hold = log_->hold.exchange(nullptr)) {
      log_->inside->Notify();
      hold->WaitForNotification();
    }
    {
      absl::MutexLock lock(&log_->mu);
      if (static_cast<int>(layer) == log_->fail_layer) {
        return absl::InternalError("injected device error");
      }
    }
    if (inner_ != nullptr) RETURN_IF_ERROR(inner_->ScatterLayer(layer, ops, ticket));
    if (options_.has_ready_words) log_->Add(layer, ticket);
    return absl::OkStatus();
  }

  const FakeEngineOptions options_;
  const std::unique_ptr<EngineIo> inner_;
  FakeEngineLog* const log_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stored_before_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t last_store_ticket_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<EngineIo> MakeFakeEngineIo(FakeEngineOptions options,
                                           std::unique_ptr<EngineIo> inner, FakeEngineLog* log) {
  return std::make_unique<FakeEngineIo>(std::move(options), std::move(inner), log);
}

}  // namespace tutti::engine
