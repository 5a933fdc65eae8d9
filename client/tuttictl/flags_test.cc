#include "client/tuttictl/flags.h"

#include "gtest/gtest.h"

namespace tutti::tuttictl {
namespace {

struct Fixture {
  bool verbose = false;
  std::string name = "x";
  uint64_t big = 5;
  uint32_t small = 7;
  FlagSet flags;
  Fixture() {
    flags.Bool("verbose", &verbose, "talk");
    flags.String("name", &name, "a name");
    flags.Uint64("big", &big, "a number");
    flags.Uint32("small", &small, "a small number");
  }
};

TEST(FlagSetTest, FormsAndPositionals) {
  Fixture f;
  auto pos = f.flags.Parse({"a", "--verbose", "--name=n1", "--big", "0x10", "b", "--small=3"});
  ASSERT_TRUE(pos.ok()) << pos.status();
  EXPECT_EQ(*pos, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(f.verbose);
  EXPECT_EQ(f.name, "n1");
  EXPECT_EQ(f.big, 16u);
  EXPECT_EQ(f.small, 3u);
  EXPECT_TRUE(f.flags.WasSet("big"));
}

TEST(FlagSetTest, DefaultsStayAndNegation) {
  Fixture f;
  f.verbose = true;
  auto pos = f.flags.Parse({"--noverbose", "--", "--big"});
  ASSERT_TRUE(pos.ok());
  EXPECT_FALSE(f.verbose);
  EXPECT_EQ(f.big, 5u);
  EXPECT_EQ(*pos, std::vector<std::string>{"--big"});
  EXPECT_FALSE(f.flags.WasSet("big"));
}

TEST(FlagSetTest, Errors) {
  Fixture f;
  EXPECT_EQ(f.flags.Parse({"--nope"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.flags.Parse({"--nope"}).status().message().find("--nope"), std::string::npos);
  EXPECT_FALSE(f.flags.Parse({"--big"}).ok());               // missing value
  EXPECT_FALSE(f.flags.Parse({"--big=-1"}).ok());            // negative
  EXPECT_FALSE(f.flags.Parse({"--big=12x"}).ok());           // junk
  EXPECT_FALSE(f.flags.Parse({"--small=4294967296"}).ok());  // > 32 bits
  EXPECT_FALSE(f.flags.Parse({"--verbose=yes"}).ok());
  EXPECT_TRUE(f.flags.Parse({"--verbose=false"}).ok());
}

TEST(FlagSetTest, TakesValueAndHelp) {
  Fixture f;
  EXPECT_TRUE(f.flags.TakesValue("name"));
  EXPECT_FALSE(f.flags.TakesValue("verbose"));
  EXPECT_FALSE(f.flags.TakesValue("unknown"));
  const std::string help = f.flags.Help();
  EXPECT_NE(help.find("--name=<string>"), std::string::npos);
  EXPECT_NE(help.find("(default 5)"), std::string::npos);
}

}  // namespace
}  // namespace tutti::tuttictl
