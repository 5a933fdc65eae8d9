// The fallback rule (backend_choice.h), as a table: every failure code, both io.fallback values,
// the fallback backend itself; and the registry it reads (backend_registry.h).
#include "daemon/io/backend_choice.h"

#include "daemon/io/backend_registry.h"
#include "gtest/gtest.h"

namespace tutti::io {
namespace {

TEST(BackendChoiceTest, ChosenHasNoReason) {
  const BackendChoice c = Chosen("uring_cmd");
  EXPECT_EQ(c.backend, "uring_cmd");
  EXPECT_EQ(c.requested, "uring_cmd");
  EXPECT_EQ(c.reason, "");
  EXPECT_FALSE(c.fell_back());
}

TEST(BackendChoiceTest, CannotRunHereFallsBackToUringWithTheReasonByDefault) {
  const absl::Status why =
      absl::UnavailableError("io.passthrough_devices: open /dev/ng0n1: No such file or directory");
  for (const char* fallback : {"", "uring"}) {
    auto c = ChooseFallback("uring_cmd", fallback, why);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->backend, "uring");
    EXPECT_EQ(c->requested, "uring_cmd");
    EXPECT_TRUE(c->fell_back());
    EXPECT_EQ(c->reason,
              "uring_cmd cannot run: io.passthrough_devices: open /dev/ng0n1: No such file or "
              "directory");
  }
}

// The reason always starts with the backend's name, and does not repeat it.
TEST(BackendChoiceTest, AReasonThatNamesTheBackendIsKeptAsItIs) {
  auto c = ChooseFallback("gds", "uring", absl::UnavailableError("gds: host mode (...)"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->reason, "gds: host mode (...)");
  auto n = ChooseFallback("nvme", "uring", absl::UnavailableError("nvmeish: no"));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->reason, "nvme cannot run: nvmeish: no");
}

TEST(BackendChoiceTest, FailRefusesWithFailedPreconditionNamingTheSettingAndTheCause) {
  for (const char* backend : {"uring_cmd", "gds", "nvme", "memory"}) {
    auto c = ChooseFallback(backend, "fail", absl::UnavailableError("no IORING_OP_URING_CMD"));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << backend;
    EXPECT_EQ(c.status().message(),
              std::string("io.backend \"") + backend +
                  "\" cannot run on this host and io.fallback is \"fail\": no IORING_OP_URING_CMD");
  }
}

// Only UNAVAILABLE means "cannot run on this host"; every other failure is returned as it is,
// whatever io.fallback says.
TEST(BackendChoiceTest, OtherFailuresNeverFallBack) {
  const absl::Status others[] = {
      absl::InvalidArgumentError("io.queue_depth must be in [1, 4096]"),
      absl::FailedPreconditionError("pool file 0 is 1 bytes; its layout says 2"),
      absl::NotFoundError("no such thing"),
      absl::PermissionDeniedError("needs CAP_SYS_ADMIN"),
      absl::InternalError("ioctl: Input/output error"),
      absl::ResourceExhaustedError("too many"),
  };
  for (const absl::Status& why : others) {
    for (const char* fallback : {"", "uring", "fail"}) {
      EXPECT_EQ(ChooseFallback("uring_cmd", fallback, why).status(), why) << why << fallback;
      EXPECT_FALSE(CannotRunHere("uring_cmd", why)) << why;
    }
  }
}

TEST(BackendChoiceTest, TheFallbackItselfNeverFallsBack) {
  const absl::Status why = absl::UnavailableError("io_uring_queue_init: Operation not permitted");
  EXPECT_FALSE(CannotRunHere("uring", why));
  EXPECT_TRUE(CannotRunHere("gds", why));
  EXPECT_EQ(ChooseFallback("uring", "uring", why).status(), why);
  EXPECT_EQ(ChooseFallback("uring", "fail", why).status(), why);
}

TEST(BackendChoiceTest, AnUnknownFallbackSettingIsInvalid) {
  for (std::string_view v : kFallbackValues) EXPECT_TRUE(CheckFallbackSetting(v).ok()) << v;
  const absl::Status bad = CheckFallbackSetting("memory");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "io.fallback: \"memory\" is not one of \"uring\", \"fail\"");
  // Checked before the failure is looked at: a wrong setting is never silently a fallback.
  EXPECT_EQ(ChooseFallback("gds", "memory", absl::UnavailableError("x")).status(), bad);
}

TEST(BackendRegistryTest, NamesPlacesAndDevices) {
  EXPECT_EQ(std::vector<std::string_view>(kBackendNames.begin(), kBackendNames.end()),
            (std::vector<std::string_view>{"uring", "memory", "gds", "uring_cmd", "nvme"}));
  EXPECT_EQ(FindBackend("spdk"), nullptr);
  ASSERT_NE(FindBackend("uring_cmd"), nullptr);
  EXPECT_EQ(FindBackend("uring_cmd")->devices_field, "io.passthrough_devices");
  EXPECT_EQ(FindBackend("nvme")->devices_field, "io.nvme_devices");
  EXPECT_TRUE(OnWholeDevices(FindBackend("nvme")->places));
  EXPECT_FALSE(OnWholeDevices(FindBackend("gds")->places));
  EXPECT_EQ(FindBackend("memory")->places, PoolPlaces::kMemory);
  EXPECT_EQ(FindBackend(kFallbackBackend)->places, PoolPlaces::kFiles);
}

}  // namespace
}  // namespace tutti::io
