// tuttictl end-session: the operator ends a session's leases (their pins go at once) or the whole
// session, e.g. an engine that pins blocks and never retrieves them (docs/security.md "Pins").
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/tuttictl/admin_call.h"
#include "client/tuttictl/command.h"
#include "client/tuttictl/output.h"
#include "common/status_macros.h"

namespace tutti::tuttictl {
namespace {

namespace v1 = tutti::v1;

class EndSessionCommand : public Command {
 public:
  std::string name() const override { return "end-session"; }
  std::string usage() const override { return "end-session ID [--leases-only]"; }
  std::string summary() const override {
    return "end a session's leases (unpinning their blocks) and, without --leases-only, the "
           "session";
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.Bool("leases-only", &leases_only_,
               "end only the leases; the session stays attached (its engine may Lookup again)");
  }
  absl::Status CheckUsage(const FlagSet&, const std::vector<std::string>& args) override {
    if (args.size() != 1) {
      return absl::InvalidArgumentError("end-session needs one session id (tuttictl sessions)");
    }
    if (!absl::SimpleAtoi(args[0], &session_id_) || session_id_ == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", args[0], "' is not a session id (a number from tuttictl sessions)"));
    }
    return absl::OkStatus();
  }
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override {
    v1::EndSessionRequest request;
    request.set_session_id(session_id_);
    request.set_leases_only(leases_only_);
    v1::EndSessionResponse r;
    RETURN_IF_ERROR(CallAdmin(options, &v1::Admin::Stub::EndSession, request, &r));
    if (options.json) {
      JsonWriter j;
      j.BeginObject().Key("session_id").Uint(session_id_);
      j.Key("leases_ended").Uint(r.leases_ended()).Key("pins_released").Uint(r.pins_released());
      j.Key("session_closed").Bool(r.session_closed()).EndObject();
      out << j.str() << "\n";
    } else {
      out << "session " << session_id_ << ": " << r.leases_ended() << " leases ended, "
          << r.pins_released() << " pins released"
          << (r.session_closed() ? "; session closed" : "; session still attached") << "\n";
    }
    return absl::OkStatus();
  }

 private:
  bool leases_only_ = false;
  uint64_t session_id_ = 0;
};

}  // namespace

std::unique_ptr<Command> NewEndSessionCommand() { return std::make_unique<EndSessionCommand>(); }

}  // namespace tutti::tuttictl
