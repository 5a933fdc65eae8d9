#include "daemon/datapath/verifier.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/datapath/fair_queue.h"
#include "daemon/pool/slot_header.h"

namespace tutti::datapath {
namespace {

// 32 objects of 32 KiB are 1 MiB: about 0.1 ms of hashing, small enough to spread a batch.
constexpr size_t kObjectsPerTask = 32;

// The checks queued, by stream. Every task the verifier schedules on the pool runs the next one
// in turn, so the pool's order (first in, first out) becomes the streams' turns. Shared with
// those tasks: the pool may run them after the verifier is gone.
class TaskTurns {
 public:
  void Push(uint64_t stream, std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    tasks_.Push(stream, std::move(task));
  }
  // Runs the task whose turn it is. Precondition: one pushed for each call.
  void RunNext() {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      task = tasks_.Pop();
    }
    task();
  }

 private:
  absl::Mutex mu_;
  FairQueue<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
};

class CpuVerifier final : public Verifier {
 public:
  explicit CpuVerifier(WorkPool* pool) : pool_(pool) {}
  std::string_view name() const override { return "cpu"; }

  void Verify(uint64_t stream, absl::Span<const ObjectCheck> checks, absl::Span<uint8_t> matches,
              std::function<void()> done) override {
    const size_t tasks = (checks.size() + kObjectsPerTask - 1) / kObjectsPerTask;
    if (tasks == 0) {
      done();
      return;
    }
    // Shared by the tasks; the last one to finish runs `done` and frees it.
    struct Batch {
      std::atomic<size_t> left;
      std::function<void()> done;
    };
    auto* batch = new Batch{{tasks}, std::move(done)};
    const bool inline_checks = pool_ == nullptr || pool_->threads() == 0;
    for (size_t t = 0; t < tasks; ++t) {
      const size_t begin = t * kObjectsPerTask;
      const size_t end = std::min(checks.size(), begin + kObjectsPerTask);
      auto task = [checks, matches, begin, end, batch] {
        for (size_t i = begin; i < end; ++i) {
          const ObjectCheck& c = checks[i];
          matches[i] =
              pool::ObjectChecksum(c.ns, *c.key, c.epoch, c.object, c.bytes, c.len) == c.expected
                  ? kMatch
                  : kMismatch;
        }
        if (batch->left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
          std::function<void()> finish = std::move(batch->done);
          delete batch;
          finish();
        }
      };
      if (inline_checks) {
        task();
        continue;
      }
      turns_->Push(stream, std::move(task));
      pool_->Schedule([turns = turns_] { turns->RunNext(); });
    }
  }

 private:
  WorkPool* const pool_;
  const std::shared_ptr<TaskTurns> turns_ = std::make_shared<TaskTurns>();
};

}  // namespace

std::unique_ptr<Verifier> MakeCpuVerifier(WorkPool* pool) {
  return std::make_unique<CpuVerifier>(pool);
}

}  // namespace tutti::datapath
