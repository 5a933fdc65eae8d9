// Tests: an in-memory I/O backend whose next Sync, once armed, stops until the test releases it,
// so a test can act while the store's pool sync is held; and whose submissions with a request
// a predicate picks are held (not yet performed, their bytes not yet read) until the test
// releases them, so a test can act while some writes are in flight.
#ifndef TUTTI_DAEMON_STORE_HOLDING_BACKEND_H_
#define TUTTI_DAEMON_STORE_HOLDING_BACKEND_H_

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

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
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (hold_ && std::any_of(batch.begin(), batch.end(), hold_)) {
        held_.push_back(Held{batch, std::move(done)});
        if (!writes_held_.HasBeenNotified()) writes_held_.Notify();
        return;
      }
    }
    inner_->Submit(batch, std::move(done));
  }
  // From now on, submissions with a request `pick` returns true for are held until
  // ReleaseWrites; writes_held() is notified at the first.
  void HoldWhere(std::function<bool(const io::IoRequest&)> pick) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = std::move(pick);
  }
  absl::Notification& writes_held() { return writes_held_; }
  // Stops holding and submits the held submissions, in their order.
  void ReleaseWrites() {
    std::vector<Held> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hold_ = nullptr;
      held.swap(held_);
    }
    for (Held& h : held) inner_->Submit(h.batch, std::move(h.done));
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
  struct Held {
    absl::Span<io::IoRequest> batch;
    std::function<void()> done;
  };
  std::unique_ptr<io::MemoryBackend> inner_;
  std::mutex mu_;
  std::function<bool(const io::IoRequest&)> hold_;  // guarded by mu_
  std::vector<Held> held_;                          // guarded by mu_
  absl::Notification writes_held_;
  std::atomic<bool> armed_{false};
  absl::Notification entered_, release_;
};

}  // namespace tutti::store::testing

#endif  // TUTTI_DAEMON_STORE_HOLDING_BACKEND_H_
