#include "daemon/datapath/verifier.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "daemon/pool/slot_header.h"

namespace tutti::datapath {
namespace {

// 32 objects of 32 KiB are 1 MiB: about 0.1 ms of hashing, small enough to spread a batch.
constexpr size_t kObjectsPerTask = 32;

class CpuVerifier final : public Verifier {
 public:
  explicit CpuVerifier(WorkPool* pool) : pool_(pool) {}
  std::string_view name() const override { return "cpu"; }

  void Verify(absl::Span<const ObjectCheck> checks, absl::Span<uint8_t> matches,
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
      if (pool_ != nullptr) {
        pool_->Schedule(std::move(task));
      } else {
        task();
      }
    }
  }

 private:
  WorkPool* const pool_;
};

}  // namespace

std::unique_ptr<Verifier> MakeCpuVerifier(WorkPool* pool) {
  return std::make_unique<CpuVerifier>(pool);
}

}  // namespace tutti::datapath
