#include "daemon/store/admission.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/store/second_sight.h"

namespace tutti::store {
namespace {

class AdmitAll final : public AdmissionPolicy {
 public:
  bool Admit(NamespaceId, const Key&) override { return true; }
  std::string_view name() const override { return "all"; }
};

}  // namespace

absl::StatusOr<std::unique_ptr<AdmissionPolicy>> MakeAdmissionPolicy(
    const AdmissionOptions& options) {
  if (options.policy == "all") return std::make_unique<AdmitAll>();
  if (options.policy == "second_sight" || options.policy == "dram_front") {
    if (options.ghost_blocks == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool.admission_ghost_blocks must be > 0 for pool.admission \"", options.policy, "\""));
    }
    return std::make_unique<SecondSight>(options.ghost_blocks,
                                         options.policy == "dram_front");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pool.admission = \"", options.policy,
                   "\": must be \"all\", \"second_sight\" or \"dram_front\""));
}

}  // namespace tutti::store
