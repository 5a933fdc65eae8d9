// tuttid as a process: start-up failures are one line and exit 1; a good start notifies systemd
// (STATUS= lines, READY=1 once listening), serves, and SIGTERM/SIGINT give STOPPING=1 and exit 0;
// a restart recovers the state. With WATCHDOG_USEC it pets the watchdog, except while stopped;
// SIGHUP applies a new log level and refuses a new pool capacity, serving on.
#include <poll.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "daemon/version.h"
#include "gtest/gtest.h"
#include "tutti/v1/admin.grpc.pb.h"

extern char** environ;

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TuttidPath() {
  return absl::StrCat(getenv("TEST_SRCDIR"), "/", getenv("TEST_WORKSPACE"), "/daemon/tuttid");
}

std::string TmpDir() {
  static std::atomic<int> n{0};
  std::string t = absl::StrCat(getenv("TEST_TMPDIR"), "/t", n++, "XXXXXX");
  EXPECT_NE(mkdtemp(t.data()), nullptr);
  return t;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Starts tuttid with `args`, stderr to `log`, NOTIFY_SOCKET=`notify` if not empty, and `extra_env`.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log,
            const std::string& notify = "", const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  if (!notify.empty()) env.push_back("NOTIFY_SOCKET=" + notify);
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> argv = {const_cast<char*>("tuttid")};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const std::string path = TuttidPath();
  EXPECT_EQ(posix_spawn(&pid, path.c_str(), &fa, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A datagram socket standing in for systemd's notify socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
    timeval tv{60, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~NotifySocket() {
    close(fd_);
    unlink(path_.c_str());
  }
  // The next datagram, or "" after `timeout`.
  std::string Receive(absl::Duration timeout = absl::Seconds(60)) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) return "";
    char buf[512];
    const ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    return n > 0 ? std::string(buf, n) : "";
  }
  // Receives until `want` comes (a heartbeat's STATUS= lines may come between); returns what came
  // before it. Fails the test if `want` does not come within 60 s.
  std::vector<std::string> ReceiveUntil(const std::string& want) {
    std::vector<std::string> before;
    for (std::string m = Receive(); m != want; m = Receive()) {
      if (m.empty()) {
        ADD_FAILURE() << "no " << want << " within 60 s; got " << absl::StrJoin(before, " | ");
        break;
      }
      before.push_back(m);
    }
    return before;
  }
  // Forgets every datagram received so far.
  void Drain() {
    while (!Receive(absl::ZeroDuration()).empty()) {
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// Runs tuttid to completion with `args`; returns its exit status and stderr.
std::pair<int, std::string> RunToExit(const std::vector<std::string>& args) {
  const std::string log = TmpDir() + "/stderr";
  const int rc = WaitExit(Spawn(args, log));
  return {rc, ReadAll(log)};
}

TEST(TuttidTest, StartupFailuresAreOneLineAndExitOne) {
  const std::string dir = TmpDir();
  auto [rc1, err1] = RunToExit({"--config=" + dir + "/absent.textproto"});
  EXPECT_EQ(rc1, 1);
  EXPECT_THAT(err1, HasSubstr("tuttid: cannot read config"));

  const std::string bad = dir + "/bad.textproto";
  std::ofstream(bad) << "pool {\n  object_bytes: 1000\n}\n";
  auto [rc2, err2] = RunToExit({"--config=" + bad});
  EXPECT_EQ(rc2, 1);
  EXPECT_THAT(err2, HasSubstr("pool.object_bytes = 1000: must be a multiple of 4096"));
  // The error is the last line, and the only one starting with "tuttid:".
  std::vector<std::string> lines = absl::StrSplit(err2, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().rfind("tuttid: ", 0), 0u) << err2;

  std::ofstream(bad) << "pool { bogus: 1 }\n";
  auto [rc3, err3] = RunToExit({"--config=" + bad});
  EXPECT_EQ(rc3, 1);
  EXPECT_THAT(err3, HasSubstr(bad + ": line 1, column"));

  auto [rc4, err4] = RunToExit({"--state_dir=relative/dir"});
  EXPECT_EQ(rc4, 1);
  EXPECT_THAT(err4, HasSubstr("tuttid: state_dir = \"relative/dir\": must be an absolute path"));
}

// What `tuttid FLAG` prints on stdout; it must exit 0.
std::string StdoutOf(const char* flag) {
  const std::string out = TmpDir() + "/stdout";
  std::vector<char*> argv = {const_cast<char*>("tuttid"), const_cast<char*>(flag), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid;
  const int spawned = posix_spawn(&pid, TuttidPath().c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  EXPECT_EQ(spawned, 0);
  if (spawned != 0) return "";
  EXPECT_EQ(WaitExit(pid), 0);
  return ReadAll(out);
}

TEST(TuttidTest, PrintsTheDefaultConfig) {
  const std::string text = StdoutOf("--print_default_config");
  EXPECT_THAT(text, HasSubstr("socket_path: \"/run/tutti/tuttid.sock\""));
  EXPECT_THAT(text, HasSubstr("capacity_bytes: 4294967296"));
}

// `tuttid --version`: the version of //:version.bzl, the one the Python package carries too.
TEST(TuttidTest, PrintsItsVersion) {
  EXPECT_EQ(StdoutOf("--version"), absl::StrCat("tuttid ", tutti::kVersion, "\n"));
}

TEST(TuttidTest, NotifiesReadyServesAndStopsCleanlyOnSignals) {
  const std::string dir = TmpDir();
  const std::string config = dir + "/tuttid.textproto";
  std::ofstream(config) << "pool { capacity_bytes: 134217728 }\n"
                           "dram { capacity_bytes: 0 }\n"
                           "limits { store_staging_bytes: 16777216 retrieve_staging_bytes: "
                           "134217728 }\n"
                           "metrics { listen: \"off\" }\n";
  // sun_path is short: the sockets go in a directory of their own under /tmp.
  std::string short_dir = "/tmp/tuttid_test_XXXXXX";
  ASSERT_NE(mkdtemp(short_dir.data()), nullptr);
  const std::string sock = short_dir + "/tuttid.sock";
  const std::string notify_path = short_dir + "/notify";
  NotifySocket notify(notify_path);
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string log = dir + "/log" + std::to_string(sig);
    const pid_t pid =
        Spawn({"--config=" + config, "--state_dir=" + dir + "/state", "--socket=" + sock}, log,
              notify_path);
    EXPECT_THAT(notify.ReceiveUntil("READY=1"),
                ElementsAre("STATUS=reading the configuration",
                            "STATUS=opening the pool and recovering the index",
                            "STATUS=starting the sessions and the sockets"))
        << ReadAll(log);
    // A second daemon on the same socket refuses before touching its own state directory.
    auto [rc, err] = RunToExit({"--state_dir=" + dir + "/other", "--socket=" + sock});
    EXPECT_EQ(rc, 1);
    EXPECT_THAT(err, HasSubstr("is answering on " + sock));
    EXPECT_NE(access((dir + "/other").c_str(), F_OK), 0);

    // The operator API is on its own socket, owner-only by default; engines' socket has none.
    struct stat st;
    ASSERT_EQ(stat((sock + ".admin").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_EQ(stat((sock + ".handoff").c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    auto admin_channel =
        grpc::CreateChannel("unix:" + sock + ".admin", grpc::InsecureChannelCredentials());
    auto admin = tutti::v1::Admin::NewStub(admin_channel);
    grpc::ClientContext ctx;
    tutti::v1::StatusResponse status;
    ASSERT_TRUE(admin->Status(&ctx, {}, &status).ok());
    // An engine that stays connected (idle) must not hold the shutdown for the grace period.
    auto channel = grpc::CreateChannel("unix:" + sock, grpc::InsecureChannelCredentials());
    grpc::ClientContext engine_ctx;
    EXPECT_EQ(tutti::v1::Admin::NewStub(channel)->Status(&engine_ctx, {}, &status).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
    const absl::Time stop_start = absl::Now();
    kill(pid, sig);
    notify.ReceiveUntil("STOPPING=1");
    EXPECT_THAT(notify.Receive(), HasSubstr("STATUS=stopping"));
    EXPECT_EQ(WaitExit(pid), 0) << ReadAll(log);
    EXPECT_LT(absl::Now() - stop_start, absl::Seconds(3));
    const std::string text = ReadAll(log);
    EXPECT_THAT(text, HasSubstr("stopped cleanly"));
    EXPECT_EQ(access(sock.c_str(), F_OK), -1) << "the socket file is removed at exit";
    EXPECT_EQ(access((sock + ".admin").c_str(), F_OK), -1);
    EXPECT_EQ(access((sock + ".handoff").c_str(), F_OK), -1);
    if (sig == SIGINT) {
      EXPECT_THAT(text, HasSubstr("opened"));  // the restart reused the pool
    }
  }
  std::filesystem::remove_all(short_dir);
}

// io.backend "uring_cmd" on a device this machine lacks: tuttid starts on io_uring over pool.dirs
// and says why in its log and in Status; with io.fallback "fail" it refuses to start.
TEST(TuttidTest, PassthroughFallsBackToUringWithTheReason) {
  const std::string dir = TmpDir();
  const std::string config = dir + "/tuttid.textproto";
  const std::string common =
      "pool { capacity_bytes: 134217728 }\n"
      "dram { capacity_bytes: 0 }\n"
      "limits { store_staging_bytes: 16777216 retrieve_staging_bytes: 134217728 }\n"
      "metrics { listen: \"off\" }\n";
  std::ofstream(config) << common
                        << "io { backend: \"uring_cmd\" passthrough_devices: "
                           "\"/dev/ng-tutti-none\" }\n";
  std::string short_dir = "/tmp/tuttid_test_XXXXXX";
  ASSERT_NE(mkdtemp(short_dir.data()), nullptr);
  const std::string sock = short_dir + "/tuttid.sock";
  NotifySocket notify(short_dir + "/notify");
  const std::string log = dir + "/log";
  const pid_t pid = Spawn({"--config=" + config, "--state_dir=" + dir + "/state",
                           "--socket=" + sock},
                          log, short_dir + "/notify");
  notify.ReceiveUntil("READY=1");
  auto admin = tutti::v1::Admin::NewStub(
      grpc::CreateChannel("unix:" + sock + ".admin", grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  tutti::v1::StatusResponse status;
  ASSERT_TRUE(admin->Status(&ctx, {}, &status).ok()) << ReadAll(log);
  EXPECT_EQ(status.io_backend(), "uring");
  EXPECT_EQ(status.io_backend_requested(), "uring_cmd");
  EXPECT_THAT(status.io_backend_reason(),
              HasSubstr("uring_cmd cannot run: io.passthrough_devices: open /dev/ng-tutti-none"));
  EXPECT_THAT(status.notes(), HasSubstr("uring_cmd cannot run"));
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid), 0) << ReadAll(log);
  EXPECT_THAT(ReadAll(log), HasSubstr("falling back to uring on pool.dirs"));

  std::ofstream(config) << common
                        << "io { backend: \"uring_cmd\" passthrough_devices: "
                           "\"/dev/ng-tutti-none\" fallback: \"fail\" }\n";
  auto [rc, err] = RunToExit({"--config=" + config, "--state_dir=" + dir + "/state2",
                              "--socket=" + sock});
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(err, HasSubstr("tuttid: io.backend \"uring_cmd\" cannot run on this host and "
                             "io.fallback is \"fail\": io.passthrough_devices: open "
                             "/dev/ng-tutti-none"));
  std::filesystem::remove_all(short_dir);
}

// Whether the operator API answers Status.
bool Answers(const std::string& sock) {
  auto admin = tutti::v1::Admin::NewStub(
      grpc::CreateChannel("unix:" + sock + ".admin", grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  tutti::v1::StatusResponse status;
  return admin->Status(&ctx, {}, &status).ok();
}

TEST(TuttidTest, WatchdogHeartbeatAndReloadOnSighup) {
  const std::string dir = TmpDir();
  const std::string config = dir + "/tuttid.textproto";
  const std::string base =
      "pool { capacity_bytes: 134217728 }\n"
      "dram { capacity_bytes: 0 }\n"
      "limits { store_staging_bytes: 16777216 retrieve_staging_bytes: 134217728 }\n";
  std::ofstream(config) << base;
  std::string short_dir = "/tmp/tuttid_test_XXXXXX";
  ASSERT_NE(mkdtemp(short_dir.data()), nullptr);
  const std::string sock = short_dir + "/tuttid.sock";
  const std::string notify_path = short_dir + "/notify";
  NotifySocket notify(notify_path);
  const std::string log = dir + "/log";
  // A watchdog of 400 ms: a beat every 200 ms.
  const pid_t pid =
      Spawn({"--config=" + config, "--state_dir=" + dir + "/state", "--socket=" + sock}, log,
            notify_path, {"WATCHDOG_USEC=400000", "TUTTID_UNIT=tuttid@7"});
  notify.ReceiveUntil("READY=1");
  notify.ReceiveUntil("WATCHDOG=1");
  EXPECT_EQ(notify.Receive(),
            "STATUS=serving: 0 sessions, 0 of 63 slots used, write backlog 0 blocks / 0 MiB "
            "(oldest 0 ms)");

  // A new log level takes: the heartbeat's debug lines appear.
  std::ofstream(config) << base << "log_level: \"debug\"\n"
                        << "datapath { max_write_backlog_age_ms: 500 }\n";
  kill(pid, SIGHUP);
  notify.ReceiveUntil("RELOADING=1");
  notify.ReceiveUntil("READY=1");
  EXPECT_THAT(ReadAll(log), HasSubstr("reload: log_level: \"info\" -> \"debug\""));
  EXPECT_THAT(ReadAll(log), HasSubstr("reload: datapath.max_write_backlog_age_ms: 10000 -> 500"));
  notify.ReceiveUntil("WATCHDOG=1");
  notify.ReceiveUntil("WATCHDOG=1");  // the beat before this one has logged
  EXPECT_THAT(ReadAll(log), HasSubstr("heartbeat: serving: 0 sessions"));

  // A new capacity is refused, named, and the daemon serves on.
  std::ofstream(config) << "pool { capacity_bytes: 268435456 }\n"
                           "dram { capacity_bytes: 0 }\n"
                           "limits { store_staging_bytes: 16777216 retrieve_staging_bytes: "
                           "134217728 }\n"
                           "log_level: \"debug\"\n"
                           "datapath { max_write_backlog_age_ms: 500 }\n";
  kill(pid, SIGHUP);
  notify.ReceiveUntil("RELOADING=1");
  notify.ReceiveUntil("READY=1");
  EXPECT_THAT(ReadAll(log), HasSubstr("reload: pool.capacity_bytes changed: it takes effect only "
                                      "at start; restart tuttid@7"));
  EXPECT_TRUE(Answers(sock));

  // An invalid file changes nothing and says why.
  std::ofstream(config) << "pool { object_bytes: 1000 }\n";
  kill(pid, SIGHUP);
  notify.ReceiveUntil("RELOADING=1");
  notify.ReceiveUntil("READY=1");
  EXPECT_THAT(ReadAll(log), HasSubstr("reload refused: " + config +
                                      ": pool.object_bytes = 1000: must be a multiple of 4096"));
  EXPECT_TRUE(Answers(sock));

  // A stopped daemon pets nothing (systemd would kill it); continued, it pets again.
  kill(pid, SIGSTOP);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(st));
  notify.Drain();
  EXPECT_EQ(notify.Receive(absl::Seconds(1)), "") << "5 beat periods while stopped";
  kill(pid, SIGCONT);
  notify.ReceiveUntil("WATCHDOG=1");

  kill(pid, SIGTERM);
  notify.ReceiveUntil("STOPPING=1");
  EXPECT_EQ(WaitExit(pid), 0) << ReadAll(log);
  std::filesystem::remove_all(short_dir);
}

std::string RunfilePath(const std::string& path) {
  return absl::StrCat(getenv("TEST_SRCDIR"), "/", getenv("TEST_WORKSPACE"), "/", path);
}

// tuttid@.service's ExecStart, with %i = 3 and its paths moved under `root`, runs tuttid with
// deploy/tuttid@0.textproto (made small, and without its metrics port); the flags take.
TEST(TuttidTest, TheTemplateUnitsCommandStartsTuttid) {
  const std::string unit = ReadAll(RunfilePath("deploy/tuttid@.service"));
  const size_t at = unit.find("\nExecStart=/usr/bin/tuttid ");
  ASSERT_NE(at, std::string::npos);
  const std::string line = unit.substr(at + 27, unit.find('\n', at + 1) - at - 27);
  std::string root = "/tmp/tuttid_unit_XXXXXX";
  ASSERT_NE(mkdtemp(root.data()), nullptr);
  std::string example = ReadAll(RunfilePath("deploy/tuttid@0.textproto"));
  for (auto [from, to] : {std::pair<std::string, std::string>{"4294967296", "134217728"},
                          {"127.0.0.1:9464", "off"}}) {
    ASSERT_NE(example.find(from), std::string::npos) << from;
    example.replace(example.find(from), from.size(), to);
  }
  std::ofstream(root + "/tuttid@3.textproto")
      << example << "dram { capacity_bytes: 0 }\n"
      << "limits { store_staging_bytes: 16777216 retrieve_staging_bytes: 134217728 }\n";
  std::vector<std::string> args;
  for (absl::string_view piece : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    std::string a(piece);
    for (const char* dir : {"/etc/tutti", "/var/lib/tutti", "/run/tutti"}) {
      if (const size_t p = a.find(dir); p != std::string::npos) a.replace(p, strlen(dir), root);
    }
    while (a.find("%i") != std::string::npos) a.replace(a.find("%i"), 2, "3");
    args.push_back(a);
  }
  EXPECT_THAT(args, ElementsAre("--config=" + root + "/tuttid@3.textproto",
                                "--state_dir=" + root + "/3", "--socket=" + root + "/3/tuttid.sock",
                                "--gpu_device=3"));
  const std::string notify_path = root + "/notify";
  NotifySocket notify(notify_path);
  const std::string log = root + "/log";
  const pid_t pid = Spawn(args, log, notify_path);
  notify.ReceiveUntil("READY=1");
  EXPECT_TRUE(Answers(root + "/3/tuttid.sock"));
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid), 0) << ReadAll(log);
  const std::string text = ReadAll(log);
  EXPECT_THAT(text, HasSubstr("state_dir: \"" + root + "/3\""));
  EXPECT_THAT(text, HasSubstr("device: 3"));
  std::filesystem::remove_all(root);
}

}  // namespace
