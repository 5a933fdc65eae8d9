// tuttictl verify, drain, config and log-level: the operator's maintenance commands.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/tuttictl/admin_call.h"
#include "client/tuttictl/command.h"
#include "client/tuttictl/output.h"
#include "common/status_macros.h"

namespace tutti::tuttictl {
namespace {

namespace v1 = tutti::v1;

// "12s", "3m04s"; "?" until there is a rate to go by.
std::string Eta(const v1::VerifyProgress& p) {
  if (p.blocks_checked() == 0 || p.elapsed_seconds() <= 0) return "?";
  const double left = static_cast<double>(p.blocks_total() - p.blocks_checked()) *
                      p.elapsed_seconds() / static_cast<double>(p.blocks_checked());
  return HumanDurationMs(static_cast<uint64_t>(left * 1000));
}

std::string Rate(const v1::VerifyProgress& p) {
  if (p.elapsed_seconds() <= 0) return "-";
  return absl::StrCat(
      HumanBytes(static_cast<uint64_t>(static_cast<double>(p.bytes_read()) / p.elapsed_seconds())),
      "/s");
}

// The figures of one progress message, after the bar or the "verify:" prefix.
std::string Figures(const v1::VerifyProgress& p) {
  return absl::StrCat(p.blocks_checked(), "/", p.blocks_total(), " blocks (",
                      Percent(p.blocks_checked(), p.blocks_total()), "), ", p.blocks_bad(),
                      " bad, ", HumanBytes(p.bytes_read()), " read, ", Rate(p), ", ETA ", Eta(p));
}

// "[#########...........] " of `width` cells.
std::string Bar(const v1::VerifyProgress& p, int width) {
  const int filled =
      p.blocks_total() == 0
          ? width
          : static_cast<int>(static_cast<double>(width) * static_cast<double>(p.blocks_checked()) /
                             static_cast<double>(p.blocks_total()));
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '.'), "] ");
}

class VerifyCommand : public Command {
 public:
  std::string name() const override { return "verify"; }
  std::string usage() const override {
    return "verify [--batch_blocks N] [--progress auto|bar|lines|none]";
  }
  std::string summary() const override {
    return "read back every block (slot header and objects), check checksums, drop bad blocks; "
           "exit 1 if any was bad";
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.Uint32("batch_blocks", &batch_blocks_, "blocks tuttid reads at a time (0: its default)");
    flags.String("progress", &progress_,
                 "auto: a bar with an ETA on a terminal, none with --json, else lines");
    flags.Uint32("progress_every_ms", &every_ms_, "at most one progress update per this many ms");
  }
  absl::Status CheckUsage(const FlagSet& flags, const std::vector<std::string>& args) override {
    RETURN_IF_ERROR(Command::CheckUsage(flags, args));
    if (progress_ != "auto" && progress_ != "bar" && progress_ != "lines" && progress_ != "none") {
      return absl::InvalidArgumentError(
          absl::StrCat("--progress must be auto, bar, lines or none, got '", progress_, "'"));
    }
    return absl::OkStatus();
  }
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override {
    std::string mode = progress_;
    if (mode == "auto") {
      mode = options.json ? "none" : (&out == &std::cout && isatty(STDOUT_FILENO)) ? "bar" : "lines";
    }
    ASSIGN_OR_RETURN(std::unique_ptr<v1::Admin::Stub> stub, ConnectAdmin(options));
    v1::VerifyRequest req;
    req.set_batch_blocks(batch_blocks_);
    req.set_progress_every_ms(every_ms_);
    grpc::ClientContext ctx;  // no deadline: a verify of a large pool takes as long as it takes
    auto reader = stub->Verify(&ctx, req);
    v1::VerifyProgress msg, last;
    while (reader->Read(&msg)) {
      if (msg.done()) {
        last = msg;
        continue;
      }
      if (mode == "bar") out << "\r" << Bar(msg, 30) << Figures(msg) << "\x1b[K" << std::flush;
      if (mode == "lines") out << "verify: " << Figures(msg) << "\n";
    }
    if (mode == "bar") out << "\n";
    RETURN_IF_ERROR(FromDaemon(reader->Finish()));
    if (!last.done()) return absl::UnavailableError("tuttid ended verify without a summary");
    options.json ? PrintJson(last, out) : PrintHuman(last, out);
    if (last.blocks_bad() > 0) {
      return absl::DataLossError(absl::StrCat(last.blocks_bad(),
                                              " bad blocks found and dropped from the index"));
    }
    return absl::OkStatus();
  }

 private:
  static void PrintHuman(const v1::VerifyProgress& r, std::ostream& out) {
    out << absl::StrFormat("verified %d blocks in %s: %d bad, %s read (%s)\n", r.blocks_checked(),
                           HumanDurationMs(static_cast<uint64_t>(r.elapsed_seconds() * 1000)),
                           r.blocks_bad(), HumanBytes(r.bytes_read()), Rate(r));
    if (r.bad_size() == 0) return;
    Table t({"NAMESPACE", "KEY", ">SLOT", "REASON"});
    for (const v1::BadBlock& b : r.bad()) {
      t.AddRow({NamespaceHex(b.namespace_id()), b.key_hex(), absl::StrCat(b.slot()), b.reason()});
    }
    out << "dropped:\n" << t.Render();
  }
  static void PrintJson(const v1::VerifyProgress& r, std::ostream& out) {
    JsonWriter j;
    j.BeginObject().Key("blocks_total").Uint(r.blocks_total());
    j.Key("blocks_checked").Uint(r.blocks_checked()).Key("blocks_bad").Uint(r.blocks_bad());
    j.Key("bytes_read").Uint(r.bytes_read()).Key("seconds").Double(r.elapsed_seconds());
    j.Key("bad").BeginArray();
    for (const v1::BadBlock& b : r.bad()) {
      j.BeginObject().Key("namespace").String(NamespaceHex(b.namespace_id()));
      j.Key("key").String(b.key_hex()).Key("slot").Uint(b.slot());
      j.Key("reason").String(b.reason()).EndObject();
    }
    j.EndArray().EndObject();
    out << j.str() << "\n";
  }

  uint32_t batch_blocks_ = 0;
  uint32_t every_ms_ = 500;
  std::string progress_ = "auto";
};

class DrainCommand : public Command {
 public:
  std::string name() const override { return "drain"; }
  std::string usage() const override { return "drain [--wait_ms N]"; }
  std::string summary() const override {
    return "wait until every captured block is durable (the write backlog empty); exit 1 if "
           "--wait_ms passed first";
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.Uint64("wait_ms", &wait_ms_, "how long tuttid waits for the backlog to empty");
  }
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override {
    v1::DrainRequest req;
    req.set_timeout_ms(std::max<uint64_t>(wait_ms_, 1));
    v1::DrainResponse r;
    RETURN_IF_ERROR(CallAdmin(options, &v1::Admin::Stub::Drain, req, &r,
                              absl::Milliseconds(wait_ms_ + options.timeout_ms)));
    if (options.json) {
      JsonWriter j;
      j.BeginObject().Key("drained").Bool(r.drained());
      j.Key("backlog_blocks_before").Uint(r.backlog_blocks_before());
      j.Key("backlog_bytes_before").Uint(r.backlog_bytes_before());
      j.Key("backlog_blocks_after").Uint(r.backlog_blocks_after());
      j.Key("backlog_bytes_after").Uint(r.backlog_bytes_after());
      j.Key("elapsed_ms").Uint(r.elapsed_ms()).EndObject();
      out << j.str() << "\n";
    } else {
      KeyValues kv;
      kv.Add("backlog before", absl::StrCat(r.backlog_blocks_before(), " blocks (",
                                            HumanBytes(r.backlog_bytes_before()), ")"));
      kv.Add("backlog after", absl::StrCat(r.backlog_blocks_after(), " blocks (",
                                           HumanBytes(r.backlog_bytes_after()), ")"));
      kv.Add(r.drained() ? "drained in" : "waited", HumanDurationMs(r.elapsed_ms()));
      out << kv.Render();
    }
    if (!r.drained()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the write backlog did not empty within ", wait_ms_, " ms (--wait_ms); ",
          r.backlog_blocks_after(), " blocks not yet durable"));
    }
    return absl::OkStatus();
  }

 private:
  uint64_t wait_ms_ = 60000;
};

class ConfigCommand : public Command {
 public:
  std::string name() const override { return "config"; }
  std::string usage() const override { return "config"; }
  std::string summary() const override {
    return "the daemon's effective configuration (as logged at start)";
  }
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override {
    v1::ConfigResponse r;
    RETURN_IF_ERROR(CallAdmin(options, &v1::Admin::Stub::Config, v1::ConfigRequest(), &r));
    if (options.json) {
      JsonWriter j;
      j.BeginObject().Key("config").String(r.text()).EndObject();
      out << j.str() << "\n";
    } else {
      out << r.text();
      if (!r.text().empty() && r.text().back() != '\n') out << "\n";
    }
    return absl::OkStatus();
  }
};

class LogLevelCommand : public Command {
 public:
  std::string name() const override { return "log-level"; }
  std::string usage() const override {
    return "log-level SUBSYSTEM|all trace|debug|info|warn|error|critical|off";
  }
  std::string summary() const override {
    return "set a subsystem's log level at run time (until restart or reload)";
  }
  absl::Status CheckUsage(const FlagSet&, const std::vector<std::string>& args) override {
    if (args.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("log-level takes SUBSYSTEM and LEVEL, got ", args.size(), " arguments"));
    }
    subsystem_ = args[0];
    level_ = args[1];
    return absl::OkStatus();
  }
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override {
    v1::SetLogLevelRequest req;
    req.set_subsystem(subsystem_);
    req.set_level(level_);
    v1::SetLogLevelResponse r;
    RETURN_IF_ERROR(CallAdmin(options, &v1::Admin::Stub::SetLogLevel, req, &r));
    if (options.json) {
      JsonWriter j;
      j.BeginObject().Key("subsystem").String(subsystem_).Key("level").String(level_);
      j.Key("previous_level").String(r.previous_level()).EndObject();
      out << j.str() << "\n";
    } else if (r.previous_level().empty()) {
      out << subsystem_ << ": " << level_ << "\n";
    } else {
      out << subsystem_ << ": " << r.previous_level() << " -> " << level_ << "\n";
    }
    return absl::OkStatus();
  }

 private:
  std::string subsystem_, level_;
};

}  // namespace

std::unique_ptr<Command> NewVerifyCommand() { return std::make_unique<VerifyCommand>(); }
std::unique_ptr<Command> NewDrainCommand() { return std::make_unique<DrainCommand>(); }
std::unique_ptr<Command> NewConfigCommand() { return std::make_unique<ConfigCommand>(); }
std::unique_ptr<Command> NewLogLevelCommand() { return std::make_unique<LogLevelCommand>(); }

}  // namespace tutti::tuttictl
