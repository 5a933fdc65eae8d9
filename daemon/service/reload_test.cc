// PlanReload over pairs of configs: run-time changes apply, start-up-only ones are refused by name.
#include "daemon/service/reload.h"

#include "config/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::service {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::Config Load(const std::string& text) {
  absl::StatusOr<v1::Config> c = config::LoadConfig(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(v1::Config());
}

TEST(ReloadTest, SameConfigChangesNothing) {
  const v1::Config c = Load("pool { dirs: \"/a\" }");
  const ReloadPlan plan = PlanReload(c, c);
  EXPECT_THAT(plan.applied, IsEmpty());
  EXPECT_THAT(plan.refused, IsEmpty());
}

TEST(ReloadTest, RunTimeFieldsApply) {
  const v1::Config running = Load("");
  const ReloadPlan plan = PlanReload(
      running, Load("log_level: \"debug\" datapath { max_write_backlog_bytes: 4194304 "
                    "max_write_backlog_age_ms: 500 }"));
  EXPECT_THAT(plan.applied,
              ElementsAre("log_level: \"info\" -> \"debug\"",
                          "datapath.max_write_backlog_bytes: 0 -> 4194304",
                          "datapath.max_write_backlog_age_ms: 10000 -> 500"));
  EXPECT_THAT(plan.refused, IsEmpty());
  EXPECT_EQ(plan.config.log_level(), "debug");
  EXPECT_EQ(plan.config.datapath().max_write_backlog_bytes(), 4194304u);
  EXPECT_EQ(plan.config.datapath().max_write_backlog_age_ms(), 500u);
}

TEST(ReloadTest, StartUpFieldsAreRefusedAndKeepTheirRunningValue) {
  const v1::Config running = Load("pool { dirs: \"/a\" }");
  const ReloadPlan plan = PlanReload(
      running, Load("pool { dirs: \"/a\" dirs: \"/b\" capacity_bytes: 8589934592 } "
                    "listen { socket_mode: 0600 } datapath { decision: \"off\" } "
                    "metrics { listen: \"127.0.0.1:9465\" } log_level: \"warn\""));
  // The automatic staging sizes follow the pool's devices: a second directory would change them
  // too, and they are start-up fields as well.
  EXPECT_THAT(plan.refused, ElementsAre("listen.socket_mode", "pool.dirs", "pool.capacity_bytes",
                                        "limits.store_staging_bytes",
                                        "limits.retrieve_staging_bytes", "datapath.decision",
                                        "metrics.listen"));
  EXPECT_THAT(plan.applied, ElementsAre("log_level: \"info\" -> \"warn\"")) << "still applies";
  v1::Config expected = running;
  expected.set_log_level("warn");
  EXPECT_EQ(plan.config.SerializeAsString(), expected.SerializeAsString());
}

TEST(ReloadTest, ReloadKeepsTheRunningConfigWhenTheFileIsBad) {
  const v1::Config running = Load("");
  const v1::Config kept = Reload(running, absl::InvalidArgumentError("f: line 1: bad"),
                                 "tuttid@0", /*store=*/nullptr);
  EXPECT_EQ(kept.SerializeAsString(), running.SerializeAsString());
}

}  // namespace
}  // namespace tutti::service
