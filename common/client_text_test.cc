#include "common/client_text.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;

TEST(ClientTextTest, PrintableTextWithinTheLimitPasses) {
  EXPECT_TRUE(CheckClientText("engine_id", "vllm worker 3 (rank 0/8) é", 64).ok());
  EXPECT_TRUE(CheckClientText("engine_id", "", 64).ok());
}

TEST(ClientTextTest, ControlCharactersAndLongTextAreRefusedByName) {
  const absl::Status nl = CheckClientText("engine_id", "a\n[info] forged", 64);
  EXPECT_EQ(nl.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nl.message()), HasSubstr("engine_id: control character 0x0a at byte 1"));
  EXPECT_FALSE(CheckClientText("x", std::string(1, '\x1b'), 64).ok());
  EXPECT_FALSE(CheckClientText("x", std::string(1, '\x7f'), 64).ok());
  const absl::Status big = CheckClientText("namespace.model_id", std::string(257, 'm'), 256);
  EXPECT_THAT(std::string(big.message()), HasSubstr("namespace.model_id: 257 bytes; at most 256"));
}

TEST(ClientTextTest, EscapedHasNoNewlinesAndIsCut) {
  EXPECT_EQ(Escaped("a\nb"), "a\\nb");
  EXPECT_EQ(Escaped("\x1b[31m"), "\\x1b[31m");
  EXPECT_EQ(Escaped(std::string(10, 'x'), 4), "xxxx...");
}

}  // namespace
}  // namespace tutti
