#include "client/hostengine/host_engine.h"

#include "client/hostengine/content.h"
#include "gtest/gtest.h"

namespace tutti::hostengine {
namespace {

KvShape SmallShape() {
  KvShape s;
  s.layers = 3;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.block_tokens = 16;  // 4 KiB objects
  return s;
}

TEST(HostEngineTest, FillVerifyZero) {
  auto e = HostEngine::Create(SmallShape(), 5, "tutti-test");
  ASSERT_TRUE(e.ok()) << e.status();
  HostEngine& engine = **e;
  EXPECT_EQ(engine.region().size(), SmallShape().region_bytes(5));
  const auto keys = MakeKeyChain(9, 2);
  engine.FillBlock(2, keys[0]);
  engine.FillBlock(3, keys[1]);
  EXPECT_EQ(engine.VerifyBlock(2, keys[0]), 0u);
  EXPECT_EQ(engine.VerifyBlock(3, keys[1]), 0u);
  EXPECT_GT(engine.VerifyBlock(2, keys[1]), 0u);
  // Filling a block touches nothing else.
  for (uint32_t l = 0; l < 3; ++l) {
    for (uint32_t p = 0; p < 2; ++p) {
      for (uint32_t b : {0u, 1u, 4u}) {
        const uint8_t* o = engine.Object(b, l, p);
        for (int i = 0; i < 4096; ++i) ASSERT_EQ(o[i], 0) << b << " " << l << " " << p;
      }
    }
  }
  // A corrupt byte in one layer shows in that layer's range only.
  engine.Object(2, 1, 1)[100] ^= 0xff;
  EXPECT_EQ(engine.VerifyBlock(2, keys[0]), 1u);
  EXPECT_EQ(engine.VerifyBlock(2, keys[0], 1, 2), 1u);
  EXPECT_EQ(engine.VerifyBlock(2, keys[0], 0, 1), 0u);
  EXPECT_EQ(engine.VerifyBlock(2, keys[0], 2, 3), 0u);
  engine.ZeroBlock(2);
  EXPECT_EQ(engine.Object(2, 2, 1)[4095], 0);
  EXPECT_EQ(engine.VerifyBlock(3, keys[1]), 0u);
}

TEST(HostEngineTest, AttachRequestDescribesTheRegion) {
  auto e = HostEngine::Create(SmallShape(), 5, "tutti-test");
  ASSERT_TRUE(e.ok());
  EngineIdentity id;
  id.model_id = "m";
  const auto req = (*e)->MakeAttachRequest(id);
  EXPECT_EQ(req.namespace_().model_id(), "m");
  EXPECT_EQ(req.namespace_().hash_scheme(), "tutti-bench-v1");
  EXPECT_EQ(req.namespace_().tp_size(), 1u);
  EXPECT_EQ(req.namespace_().layout().num_layers(), 3u);
  ASSERT_EQ(req.regions_size(), 1);
  EXPECT_EQ(req.regions(0).host_shm().name(), (*e)->region().name());
  EXPECT_EQ(req.regions(0).host_shm().size_bytes(), (*e)->region().size());
  EXPECT_EQ(req.placements_size(), 6);
  EXPECT_EQ(req.num_blocks(), 5u);
  // Placement (l, p) plus block * stride is where Object() points.
  const auto& pl = req.placements(2 * 2 + 1);
  EXPECT_EQ((*e)->region().data() + pl.offset() + 3 * pl.block_stride(), (*e)->Object(3, 2, 1));
}

TEST(HostEngineTest, RejectsBadShape) {
  KvShape s = SmallShape();
  s.layers = 0;
  EXPECT_EQ(HostEngine::Create(s, 5, "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostEngine::Create(SmallShape(), 0, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti::hostengine
