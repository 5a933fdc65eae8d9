// tuttictl remove-namespace: the operator frees a namespace's place (docs/security.md
// "Namespaces").
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/tuttictl/admin_call.h"
#include "client/tuttictl/command.h"
#include "client/tuttictl/flags.h"
#include "client/tuttictl/output.h"
#include "common/status_macros.h"

namespace tutti::tuttictl {
namespace {

namespace v1 = tutti::v1;

class RemoveNamespaceCommand : public Command {
 public:
  std::string name() const override { return "remove-namespace"; }
  std::string usage() const override { return "remove-namespace ID [--force]"; }
  std::string summary() const override {
    return "evict a namespace's blocks and forget it, freeing its place (--force: detach its "
           "sessions first)";
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.Bool("force", &force_, "end the namespace's sessions first");
  }
  absl::Status CheckUsage(const FlagSet&, const std::vector<std::string>& args) override {
    if (args.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "remove-namespace takes one namespace id (as `tuttictl stats` prints it), got ",
          args.size(), " arguments"));
    }
    if (!ParseUnsigned(args[0], &id_) || id_ == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", args[0], "' is not a namespace id (0x followed by hex, or decimal; not 0)"));
    }
    return absl::OkStatus();
  }
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override {
    v1::RemoveNamespaceRequest req;
    req.set_namespace_id(id_);
    req.set_force(force_);
    v1::RemoveNamespaceResponse r;
    RETURN_IF_ERROR(CallAdmin(options, &v1::Admin::Stub::RemoveNamespace, req, &r));
    if (options.json) {
      JsonWriter j;
      j.BeginObject().Key("namespace_id").String(NamespaceHex(id_));
      j.Key("evicted").Uint(r.evicted()).Key("sessions_closed").Uint(r.sessions_closed());
      out << j.EndObject().str() << "\n";
    } else {
      out << "removed namespace " << NamespaceHex(id_) << ": " << r.evicted() << " blocks evicted, "
          << r.sessions_closed() << " sessions closed\n";
    }
    return absl::OkStatus();
  }

 private:
  uint64_t id_ = 0;
  bool force_ = false;
};

}  // namespace

std::unique_ptr<Command> NewRemoveNamespaceCommand() {
  return std::make_unique<RemoveNamespaceCommand>();
}

}  // namespace tutti::tuttictl
