// tuttictl's subcommands. Each declares its flags, checks its usage (a usage error exits 2,
// before anything is sent), then runs against the daemon (a failure exits 1).
//
// Thread-safety: not thread-safe; one command runs per process.
#ifndef TUTTI_CLIENT_TUTTICTL_COMMAND_H_
#define TUTTI_CLIENT_TUTTICTL_COMMAND_H_

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/tuttictl/flags.h"

namespace tutti::tuttictl {

enum ExitCode { kExitOk = 0, kExitFailure = 1, kExitUsage = 2 };

// Flags every subcommand takes.
struct GlobalOptions {
  std::string socket;           // tuttid's engine socket (bench)
  std::string admin_socket;     // the operator API's socket; empty: socket + ".admin"
  bool json = false;            // JSON instead of tables
  uint64_t timeout_ms = 10000;  // connect and admin-call deadline
};

// The socket admin commands connect to.
inline std::string AdminSocket(const GlobalOptions& o) {
  return o.admin_socket.empty() ? o.socket + ".admin" : o.admin_socket;
}

class Command {
 public:
  virtual ~Command() = default;
  virtual std::string name() const = 0;
  virtual std::string usage() const = 0;    // "evict --namespace ID | --all"
  virtual std::string summary() const = 0;  // one line
  // Registers this command's own flags (the global ones are registered by main).
  virtual void RegisterFlags(FlagSet& flags) {}
  // Checks flag combinations and positional arguments. INVALID_ARGUMENT, with the reason, is a
  // usage error.
  virtual absl::Status CheckUsage(const FlagSet& flags, const std::vector<std::string>& args);
  // Runs, writing the result to `out`. Returns the failure (its message is printed by main), or
  // OK. `out` receives partial output before a failure where that is useful.
  virtual absl::Status Run(const GlobalOptions& options, std::ostream& out) = 0;
};

// The subcommands (admin_commands.cc, bench_command.cc).
std::unique_ptr<Command> NewStatusCommand();
std::unique_ptr<Command> NewSessionsCommand();
std::unique_ptr<Command> NewStatsCommand();
std::unique_ptr<Command> NewEvictCommand();
// session_commands.cc
std::unique_ptr<Command> NewEndSessionCommand();
std::unique_ptr<Command> NewBenchCommand();
// ops_commands.cc, devices_command.cc
std::unique_ptr<Command> NewVerifyCommand();
std::unique_ptr<Command> NewDrainCommand();
std::unique_ptr<Command> NewDevicesCommand();
std::unique_ptr<Command> NewConfigCommand();
std::unique_ptr<Command> NewLogLevelCommand();
// namespace_command.cc
std::unique_ptr<Command> NewRemoveNamespaceCommand();

// status, sessions, stats, evict, end-session, verify, drain, devices, config, log-level, bench: in
// the order the help lists them.
std::vector<std::unique_ptr<Command>> AllCommands();

// Runs tuttictl with `args` (without the program name); writes results to `out` and errors and
// help to `err`. Returns the exit code. main() is a call of this.
int RunTuttictl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace tutti::tuttictl

#endif  // TUTTI_CLIENT_TUTTICTL_COMMAND_H_
