#include "bench/jsonl.h"

#include "gtest/gtest.h"

namespace tutti::bench {
namespace {

TEST(JsonlTest, LineWithBaselineHasTheRatio) {
  Result r{"retrieve", 50.0, "GB/s", "contiguous", 55.0};
  EXPECT_EQ(JsonLine("gpu_retrieve", r, "H200", "2026-11-29T00:00:00Z", "bench --x"),
            "{\"bench\":\"gpu_retrieve\",\"metric\":\"retrieve\",\"value\":50,\"unit\":\"GB/s\","
            "\"baseline_name\":\"contiguous\",\"baseline_value\":55,\"ratio\":0.909091,"
            "\"machine\":\"H200\",\"date\":\"2026-11-29T00:00:00Z\",\"command\":\"bench --x\"}");
}

TEST(JsonlTest, LineWithoutBaselineWritesNullsAndTheDetail) {
  Result r{"healthy", 1, "bool"};
  r.detail = "cudaSuccess";
  EXPECT_EQ(JsonLine("gpu_owner_death", r, "m", "d", "c"),
            "{\"bench\":\"gpu_owner_death\",\"metric\":\"healthy\",\"value\":1,\"unit\":\"bool\","
            "\"baseline_name\":null,\"baseline_value\":null,\"ratio\":null,"
            "\"detail\":\"cudaSuccess\",\"machine\":\"m\",\"date\":\"d\",\"command\":\"c\"}");
}

TEST(JsonlTest, StringsAreEscaped) {
  EXPECT_EQ(JsonString("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
}

TEST(JsonlTest, CommandLineJoinsTheArguments) {
  char a[] = "bench", b[] = "--out=x.jsonl";
  char* argv[] = {a, b};
  EXPECT_EQ(CommandLine(2, argv), "bench --out=x.jsonl");
}

}  // namespace
}  // namespace tutti::bench
