// tuttictl's front: global flags, finding the subcommand, help, and exit codes.
#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/tuttictl/command.h"
#include "common/connect.h"

namespace tutti::tuttictl {
namespace {

void RegisterGlobalFlags(FlagSet& flags, GlobalOptions& options, bool& help) {
  flags.String("socket", &options.socket, "tuttid's engine socket (bench uses it)");
  flags.String("admin_socket", &options.admin_socket,
               "tuttid's operator socket (status, sessions, stats, evict); default: the "
               "engine socket + \".admin\" (listen.admin_socket_path)");
  flags.Bool("json", &options.json, "print JSON instead of tables");
  flags.Uint64("timeout_ms", &options.timeout_ms, "deadline to connect and for admin calls");
  flags.Bool("help", &help, "show help");
}

std::string Usage(const std::vector<std::unique_ptr<Command>>& commands) {
  std::string out =
      "usage: tuttictl [--socket PATH] [--json] <command> [flags]\n\n"
      "Operates tuttid, the SSD-backed KV cache daemon.\n\ncommands:\n";
  size_t width = 0;
  for (const auto& c : commands) width = std::max(width, c->name().size());
  for (const auto& c : commands) {
    out += absl::StrCat("  ", c->name(), std::string(width - c->name().size() + 2, ' '),
                        c->summary(), "\n");
  }
  GlobalOptions options;
  options.socket = kDefaultSocket;
  bool help = false;
  FlagSet global;
  RegisterGlobalFlags(global, options, help);
  return out + "\nglobal flags:\n" + global.Help() +
         "\n'tuttictl <command> --help' shows a command's flags.\n"
         "exit status: 0 ok, 1 failure, 2 usage error\n";
}

std::string CommandHelp(Command& command, const FlagSet& flags) {
  return absl::StrCat("usage: tuttictl ", command.usage(), "\n\n", command.summary(),
                      "\n\nflags:\n", flags.Help());
}

// The index of the subcommand's name in `args`: the first argument that is not a flag or a
// flag's value. -1 if none.
int FindCommand(const std::vector<std::string>& args,
                const std::vector<std::unique_ptr<Command>>& commands) {
  GlobalOptions scratch;
  bool help = false;
  FlagSet all;
  RegisterGlobalFlags(all, scratch, help);
  for (const auto& c : commands) c->RegisterFlags(all);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") return i + 1 < args.size() ? static_cast<int>(i + 1) : -1;
    if (a.size() < 2 || a[0] != '-') return static_cast<int>(i);
    const std::string body = a.substr(a[1] == '-' ? 2 : 1);
    if (body.find('=') == std::string::npos && all.TakesValue(body)) ++i;
  }
  return -1;
}

}  // namespace

absl::Status Command::CheckUsage(const FlagSet&, const std::vector<std::string>& args) {
  if (!args.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[0], "'"));
  }
  return absl::OkStatus();
}

std::vector<std::unique_ptr<Command>> AllCommands() {
  std::vector<std::unique_ptr<Command>> out;
  out.push_back(NewStatusCommand());
  out.push_back(NewSessionsCommand());
  out.push_back(NewStatsCommand());
  out.push_back(NewEvictCommand());
  out.push_back(NewEndSessionCommand());
  out.push_back(NewRemoveNamespaceCommand());
  out.push_back(NewVerifyCommand());
  out.push_back(NewDrainCommand());
  out.push_back(NewDevicesCommand());
  out.push_back(NewConfigCommand());
  out.push_back(NewLogLevelCommand());
  out.push_back(NewBenchCommand());
  return out;
}

int RunTuttictl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  auto commands = AllCommands();
  const int at = FindCommand(args, commands);
  const std::string name = at < 0 ? "" : args[at];
  if (name.empty() || name == "help") {
    const bool asked =
        name == "help" || std::find(args.begin(), args.end(), "--help") != args.end();
    (asked ? out : err) << Usage(commands);
    return asked ? kExitOk : kExitUsage;
  }
  auto it = std::find_if(commands.begin(), commands.end(),
                         [&](const auto& c) { return c->name() == name; });
  if (it == commands.end()) {
    err << "tuttictl: unknown command '" << name << "'\n\n" << Usage(commands);
    return kExitUsage;
  }
  Command& command = **it;
  GlobalOptions options;
  options.socket = kDefaultSocket;
  bool help = false;
  FlagSet flags;
  RegisterGlobalFlags(flags, options, help);
  command.RegisterFlags(flags);
  std::vector<std::string> rest = args;
  rest.erase(rest.begin() + at);
  auto positional = flags.Parse(rest);
  if (!positional.ok()) {
    err << "tuttictl " << name << ": " << positional.status().message() << "\n\n"
        << CommandHelp(command, flags);
    return kExitUsage;
  }
  if (help) {
    out << CommandHelp(command, flags);
    return kExitOk;
  }
  if (absl::Status usage = command.CheckUsage(flags, *positional); !usage.ok()) {
    err << "tuttictl " << name << ": " << usage.message() << "\n\n" << CommandHelp(command, flags);
    return kExitUsage;
  }
  if (absl::Status run = command.Run(options, out); !run.ok()) {
    out.flush();
    err << "tuttictl " << name << ": " << run.message() << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace tutti::tuttictl
