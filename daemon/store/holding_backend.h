// Tests: an in-memory I/O backend whose next Sync, once armed, stops until the test releases it,
// so a test can act while the store's pool sync is held.
#ifndef TUTTI_DAEMON_STORE_HOLDING_BACKEND_H_
#define TUTTI_DAEMON_STORE_HOLDING_BACKEND_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/synchronization/notification.h"
#include "daemon/io/memory_backend.h"

namespace tutti::store::testing {

class HoldingBackend final : public io::IoBackend {
 public:
  explicit HoldingBackend(std::shared_ptr<io::MemoryDisk> disk)
      : inner_(io::MemoryBackend::CreateOn(std::move(disk))) {}
  std::string_view name() const override { return "holding"; }
  uint32_t num_files() const override { return inner_->num_files(); }
  uint64_t file_size(uint32_t f) const override { return inner_->file_size(f); }
  absl::Status RegisterBuffer(absl::Span<uint8_t> r) override { return inner_->RegisterBuffer(r); }
  void Submit(absl::Span<io::IoRequest> batch, std::function<void()> done) override {
    inner_->Submit(batch, std::move(done));
  }
  // Once armed, the next Sync notifies entered() and waits for release() before syncing.
  absl::Status Sync(uint32_t file) override {
    if (armed_.exchange(false)) {
      entered_.Notify();
      release_.WaitForNotification();
    }
    return inner_->Sync(file);
  }
  void Arm() { armed_ = true; }
  absl::Notification& entered() { return entered_; }
  absl::Notification& release() { return release_; }

 private:
  std::unique_ptr<io::MemoryBackend> inner_;
  std::atomic<bool> armed_{false};
  absl::Notification entered_, release_;
};

}  // namespace tutti::store::testing

#endif  // TUTTI_DAEMON_STORE_HOLDING_BACKEND_H_
