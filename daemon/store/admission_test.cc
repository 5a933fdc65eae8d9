#include "daemon/store/admission.h"

#include <memory>

#include "daemon/store/second_sight.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

Key K(uint8_t b) {
  Key k;
  k.bytes[0] = b;
  k.bytes[15] = static_cast<uint8_t>(~b);
  return k;
}

TEST(AdmissionTest, AllAdmitsEveryBlock) {
  auto p = MakeAdmissionPolicy(AdmissionOptions{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->name(), "all");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE((*p)->Admit(1, K(1)));
}

TEST(AdmissionTest, UnknownPolicyAndZeroGhostAreRefusedNamingTheField) {
  auto bad = MakeAdmissionPolicy(AdmissionOptions{"lru", 8});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("pool.admission"), std::string::npos);
  auto zero = MakeAdmissionPolicy(AdmissionOptions{"second_sight", 0});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("pool.admission_ghost_blocks"), std::string::npos);
  auto ok = MakeAdmissionPolicy(AdmissionOptions{"second_sight", 4});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->name(), "second_sight");
  EXPECT_FALSE((*ok)->keeps_declined_in_dram());
}

TEST(AdmissionTest, DramFrontIsSecondSightKeepingDeclinedBlocksInDram) {
  auto zero = MakeAdmissionPolicy(AdmissionOptions{"dram_front", 0});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("pool.admission_ghost_blocks"), std::string::npos);
  auto p = MakeAdmissionPolicy(AdmissionOptions{"dram_front", 4});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->name(), "dram_front");
  EXPECT_TRUE((*p)->keeps_declined_in_dram());
  EXPECT_FALSE((*p)->Admit(1, K(1)));  // first sight: declined (the store keeps it in DRAM)
  EXPECT_TRUE((*p)->Admit(1, K(1)));   // second: admitted
}

TEST(SecondSightTest, FirstSightDeclinedSecondAdmitted) {
  SecondSight p(8);
  EXPECT_FALSE(p.Admit(1, K(1)));
  EXPECT_TRUE(p.Admit(1, K(1)));
  EXPECT_TRUE(p.Admit(1, K(1)));  // stays remembered once admitted
  EXPECT_FALSE(p.Admit(1, K(2)));
  EXPECT_EQ(p.size(), 2u);
}

TEST(SecondSightTest, NamespacesAreSeparate) {
  SecondSight p(8);
  EXPECT_FALSE(p.Admit(1, K(1)));
  EXPECT_FALSE(p.Admit(2, K(1)));  // the same key in another namespace is a first sight
  EXPECT_TRUE(p.Admit(2, K(1)));
  EXPECT_TRUE(p.Admit(1, K(1)));
}

TEST(SecondSightTest, GhostBoundForgetsTheLeastRecentlySeen) {
  SecondSight p(2);
  EXPECT_FALSE(p.Admit(1, K(1)));
  EXPECT_FALSE(p.Admit(1, K(2)));
  EXPECT_FALSE(p.Admit(1, K(3)));  // K(1), the oldest, goes
  EXPECT_EQ(p.size(), 2u);
  EXPECT_FALSE(p.Admit(1, K(1)));  // forgotten: a first sight again (K(2) goes)
  EXPECT_TRUE(p.Admit(1, K(3)));   // K(3) is now the most recent; K(1) the oldest
  EXPECT_FALSE(p.Admit(1, K(4)));  // K(1) goes, not K(3)
  EXPECT_TRUE(p.Admit(1, K(3)));
  EXPECT_FALSE(p.Admit(1, K(1)));
  EXPECT_EQ(p.size(), 2u);
}

}  // namespace
}  // namespace tutti::store
