// A test fake of a verifier that places (daemon/gpu/gpu_verifier.h with layers staged on the GPU):
// it copies each object from where it was read to ObjectCheck::place (host memory standing in for
// the GPU), scribbles over the source (the bounce slot is reused once `done` runs, or `released`
// with VerifyReleasing, so nothing may read it after), runs `released` as the GPU's does once its
// copies have landed, checks the copy with `cpu`, and reports the place as the object's device
// copy. With answer_not_checked set, it answers kNotChecked instead of checking, as the GPU's does
// after a CUDA error that followed the release.
//
// ReleasingVerifierFake: a base for test verifiers written as VerifyReleasing (Verify is one whose
// bytes go back with the answer).
#ifndef TUTTI_DAEMON_DATAPATH_PLACING_VERIFIER_FAKE_H_
#define TUTTI_DAEMON_DATAPATH_PLACING_VERIFIER_FAKE_H_

#include <cstring>
#include <memory>
#include <vector>

#include "daemon/datapath/verifier.h"

namespace tutti::datapath {

class ReleasingVerifierFake : public Verifier {
 public:
  void Verify(uint64_t stream, absl::Span<const ObjectCheck> checks, absl::Span<uint8_t> matches,
              std::function<void()> done) final {
    VerifyReleasing(
        stream, checks, matches, [] {}, std::move(done));
  }
  void VerifyReleasing(uint64_t stream, absl::Span<const ObjectCheck> checks,
                       absl::Span<uint8_t> matches, std::function<void()> released,
                       std::function<void()> done) override = 0;
};

class PlacingVerifierFake final : public ReleasingVerifierFake {
 public:
  explicit PlacingVerifierFake(Verifier* cpu) : cpu_(cpu) {}
  std::string_view name() const override { return "placing-fake"; }
  void VerifyReleasing(uint64_t stream, absl::Span<const ObjectCheck> checks,
                       absl::Span<uint8_t> matches, std::function<void()> released,
                       std::function<void()> done) override {
    auto placed = std::make_shared<std::vector<ObjectCheck>>(checks.begin(), checks.end());
    for (ObjectCheck& c : *placed) {
      if (c.len == 0 || c.place == nullptr) continue;  // not placed: device_copy stays null
      std::memcpy(c.place, c.bytes, c.len);
      std::memset(const_cast<uint8_t*>(c.bytes), 0xee, c.len);
      c.bytes = c.place;
    }
    released();
    if (answer_not_checked) {
      for (size_t i = 0; i < placed->size(); ++i) {
        matches[i] = (*placed)[i].len == 0 ? kMismatch : kNotChecked;
      }
      done();
      return;
    }
    cpu_->Verify(stream, *placed, matches, [placed, matches, done = std::move(done)] {
      for (size_t i = 0; i < placed->size(); ++i) {
        const ObjectCheck& c = (*placed)[i];
        if (matches[i] && c.place != nullptr && c.device_copy != nullptr) *c.device_copy = c.place;
      }
      done();
    });
  }

  bool answer_not_checked = false;

 private:
  Verifier* const cpu_;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_PLACING_VERIFIER_FAKE_H_
