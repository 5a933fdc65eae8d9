#include "daemon/engine/engine_io.h"

#include <atomic>
#include <utility>

namespace tutti::engine {
namespace {

class HostEngineIo final : public EngineIo {
 public:
  explicit HostEngineIo(std::unique_ptr<EngineMemory> memory) : memory_(std::move(memory)) {}

  std::string_view kind() const override { return memory_->kind(); }
  uint32_t num_blocks() const override { return memory_->num_blocks(); }
  bool is_device() const override { return false; }
  bool has_ready_words() const override { return false; }

  absl::Status ScatterLayer(uint32_t, absl::Span<const CopyOp> ops, uint32_t) override {
    if (closed_.load()) return Closed();
    return memory_->Scatter(ops);
  }
  absl::Status SignalLayers(uint32_t, uint32_t, uint32_t) override {
    return closed_.load() ? Closed() : absl::OkStatus();
  }
  absl::Status Gather(absl::Span<const CopyOp> ops) override {
    if (closed_.load()) return Closed();
    return memory_->Gather(ops);
  }
  absl::Status SignalCaptured(uint32_t) override {
    return closed_.load() ? Closed() : absl::OkStatus();
  }
  void Close() override { closed_.store(true); }

 private:
  static absl::Status Closed() { return absl::CancelledError("the session was closed"); }

  const std::unique_ptr<EngineMemory> memory_;
  std::atomic<bool> closed_{false};
};

class NoMemoryEngineIo final : public EngineIo {
 public:
  std::string_view kind() const override { return "none"; }
  uint32_t num_blocks() const override { return 0; }
  bool is_device() const override { return false; }
  bool has_ready_words() const override { return false; }
  absl::Status ScatterLayer(uint32_t, absl::Span<const CopyOp>, uint32_t) override {
    return NoMemory();
  }
  absl::Status SignalLayers(uint32_t, uint32_t, uint32_t) override { return absl::OkStatus(); }
  absl::Status Gather(absl::Span<const CopyOp>) override { return NoMemory(); }
  absl::Status SignalCaptured(uint32_t) override { return absl::OkStatus(); }
  void Close() override {}

 private:
  static absl::Status NoMemory() {
    return absl::FailedPreconditionError("the session is memory-less: it attached no memory");
  }
};

}  // namespace

std::unique_ptr<EngineIo> MakeHostEngineIo(std::unique_ptr<EngineMemory> memory) {
  return std::make_unique<HostEngineIo>(std::move(memory));
}

std::unique_ptr<EngineIo> MakeNoMemoryEngineIo() { return std::make_unique<NoMemoryEngineIo>(); }

}  // namespace tutti::engine
