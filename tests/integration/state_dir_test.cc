// The state directory under a running tuttid: a second daemon pointed at it is refused at start
// (the first keeps serving), and a state directory removed while the daemon runs stops every
// durable acknowledgement, is said loudly, and is reported at the next start as an empty index
// over a used pool.
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "gtest/gtest.h"
#include "tests/common/daemon_launch.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

namespace fs = std::filesystem;

hostengine::StoreTally StoreAll(EngineSession& s, absl::Span<const Key> keys) {
  hostengine::StoreOptions so;
  so.batch = 50;
  return hostengine::StoreKeys(*s.client, *s.engine, keys, so);
}

TEST(StateDirTest, ASecondDaemonOnTheSameStateDirectoryIsRefusedAndTheFirstKeepsServing) {
  TuttidConfig config;
  auto first_env = TuttidEnv::Create(config);
  auto second_env = TuttidEnv::Create(config);  // its own pool and socket, the first's state
  ASSERT_TRUE(first_env.ok() && second_env.ok());
  auto first = TuttidProcess::Start(**first_env);
  ASSERT_TRUE(first.ok()) << first.status();

  const std::string log = (*second_env)->root() + "/second.log";
  auto pid = SpawnLogged(
      {TuttidBinary(), "--config=" + (*second_env)->config_path(),
       "--state_dir=" + (*first_env)->state_dir(), "--socket=" + (*second_env)->socket()},
      log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const int status = WaitForExit(*pid, absl::Seconds(60));
  ASSERT_NE(status, -1) << "the second daemon started on a state directory in use:\n"
                        << FileTail(log, 4000);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << FileTail(log, 4000);
  const std::string tail = FileTail(log, 4000);
  EXPECT_NE(tail.find(absl::StrCat("in use by another process (pid ", (*first)->pid())),
            std::string::npos)
      << tail;

  auto s = AttachEngine(**first, SmallShape(), 64);
  ASSERT_TRUE(s.ok()) << s.status();
  const auto keys = hostengine::MakeKeyChain(3, 100);
  EXPECT_EQ(StoreAll(*s, keys).durable, keys.size());
  ASSERT_TRUE(s->client->Detach().ok());
  s->client.reset();
  auto code = (*first)->Stop();
  ASSERT_TRUE(code.ok() && *code == 0) << (*first)->LogTail();
  EXPECT_TRUE(fs::exists((*first_env)->state_dir() + "/checkpoint")) << "the first one's state";
}

TEST(StateDirTest, RemovedStateDirectoryStopsDurableAcknowledgementsAndIsReportedAtRestart) {
  TuttidConfig config;
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  const auto before = hostengine::MakeKeyChain(5, 100);
  const auto after = hostengine::MakeKeyChain(6, 100);
  {
    auto daemon = TuttidProcess::Start(**env);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto s = AttachEngine(**daemon, SmallShape(), 64);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(StoreAll(*s, before).durable, before.size());
    fs::remove_all((*env)->state_dir());
    const hostengine::StoreTally lost = StoreAll(*s, after);
    EXPECT_EQ(lost.durable, 0u) << "acknowledged durable into a removed state directory";
    EXPECT_EQ(lost.failed, after.size());
    ASSERT_TRUE(s->client->Detach().ok());
    s->client.reset();
    auto code = (*daemon)->Stop();
    ASSERT_TRUE(code.ok()) << code.status();
    const std::string log = (*daemon)->LogTail(20000);
    EXPECT_NE(log.find("DURABILITY LOST"), std::string::npos) << log;
    EXPECT_EQ(log.find("still holds"), std::string::npos) << log;
  }
  fs::create_directories((*env)->state_dir());
  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string log = (*daemon)->LogTail(20000);
  EXPECT_NE(log.find("the journal in " + (*env)->state_dir() + " holds no block, but"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace tutti::testing
