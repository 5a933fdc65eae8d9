// The shared queue code and descriptors, driven by hand (no controller thread): ring full/wrap,
// phase flips, SQE encoding, PRP windows and SGL descriptors, status words and errno mapping.
#include "daemon/io/nvme/queue.h"

#include <cerrno>
#include <cstring>
#include <vector>

#include "daemon/io/nvme/descriptors.h"
#include "daemon/io/nvme/model/controller_model.h"
#include "daemon/io/nvme/status_text.h"
#include "gtest/gtest.h"

namespace tutti::io::nvme {
namespace {

struct HandRing {
  explicit HandRing(uint32_t depth) : sqes(depth), cqes(depth) {
    q.sq = SubmissionRing{sqes.data(), &sq_doorbell, depth};
    q.cq = CompletionRing{cqes.data(), &cq_doorbell, depth};
  }
  // What a controller does: posts a completion for `cid` at its tail with its phase.
  void Post(uint16_t cid, uint16_t status, uint16_t sq_head) {
    cqes[ctail] = Cqe{0, 0, sq_head, CqeDw3(cid, cphase, status)};
    if (++ctail == cqes.size()) {
      ctail = 0;
      cphase ^= 1;
    }
  }
  std::vector<Sqe> sqes;
  std::vector<Cqe> cqes;
  uint32_t sq_doorbell = 0, cq_doorbell = 0;
  uint32_t ctail = 0, cphase = 1;
  QueueRing q;
};

TEST(QueueTest, SqHoldsDepthMinusOneAndWraps) {
  HandRing r(4);
  Sqe e = {};
  EXPECT_EQ(SqFreeSlots(r.q.sq), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(SqPush(&r.q.sq, e));
  EXPECT_FALSE(SqPush(&r.q.sq, e)) << "one slot stays empty";
  RingSq(&r.q.sq);
  EXPECT_EQ(r.sq_doorbell, 3u);
  // The controller fetched all three and says so in a completion: the slots free up.
  r.Post(0, kStatusSuccess, 3);
  Cqe c;
  ASSERT_TRUE(CqPeek(r.q.cq, &c));
  CqPop(&r.q, c);
  EXPECT_EQ(SqFreeSlots(r.q.sq), 3u);
  EXPECT_TRUE(SqPush(&r.q.sq, e));
  EXPECT_EQ(r.q.sq.tail, 0u) << "tail wrapped";
}

TEST(QueueTest, CompletionsAreSeenByPhaseAcrossManyLaps) {
  HandRing r(4);
  Cqe c;
  EXPECT_FALSE(CqPeek(r.q.cq, &c)) << "zeroed memory has phase 0: nothing new";
  for (uint16_t cid = 0; cid < 50; ++cid) {
    r.Post(cid, cid % 7 == 0 ? kStatusInternalError : kStatusSuccess, 0);
    ASSERT_TRUE(CqPeek(r.q.cq, &c)) << cid;
    EXPECT_EQ(CqeCid(c.dw3), cid);
    EXPECT_EQ(CqeStatus(c.dw3), cid % 7 == 0 ? kStatusInternalError : kStatusSuccess);
    CqPop(&r.q, c);
    EXPECT_FALSE(CqPeek(r.q.cq, &c)) << "old entry of the previous lap must not read as new";
  }
  EXPECT_EQ(r.q.cq.phase, (50 / 4) % 2 == 0 ? 1u : 0u);
  RingCq(&r.q.cq);
  EXPECT_EQ(r.cq_doorbell, 50u % 4);
}

TEST(QueueTest, ReadWriteEncoding) {
  RegionDescriptor d;
  d.iova = 0x10000;
  d.size = 1 << 20;
  d.max_transfer = 128 << 10;
  d.use_sgl = 1;
  Sqe e;
  ASSERT_TRUE(BuildReadWrite(kNvmWrite, 77, 1, 0x123456789ull, 8, 12, d, 8192, &e));
  EXPECT_EQ(SqeOpcode(e), kNvmWrite);
  EXPECT_EQ(SqeCid(e), 77);
  EXPECT_TRUE(SqeUsesSgl(e));
  EXPECT_EQ(e.nsid, 1u);
  EXPECT_EQ(e.cdw10, 0x23456789u);
  EXPECT_EQ(e.cdw11, 0x1u);
  EXPECT_EQ(e.cdw12, 7u) << "NLB is 0-based";
  SglDescriptor sgl;
  std::memcpy(&sgl, e.dptr, sizeof(sgl));
  EXPECT_EQ(sgl.address, 0x10000u + 8192);
  EXPECT_EQ(sgl.length, 8u * 4096);
  EXPECT_EQ(sgl.identifier, kSglDataBlock);
  EXPECT_FALSE(BuildReadWrite(kNvmRead, 1, 1, 0, 0, 12, d, 0, &e)) << "zero blocks";
  EXPECT_FALSE(BuildReadWrite(kNvmRead, 1, 1, 0, 33, 12, d, 0, &e)) << "over max_transfer";
  EXPECT_FALSE(BuildReadWrite(kNvmRead, 1, 1, 0, 2, 12, d, d.size - 4096, &e)) << "leaves region";
}

// Every transfer of up to max_transfer at every page of a region: PRP1/PRP2 as the spec wants,
// list entries naming the right pages, and never running into the end of a list page.
TEST(DescriptorsTest, WindowedPrpListsCoverEveryTransfer) {
  auto model = ControllerModel::Create(ModelOptions{}).value();
  DescriptorOptions o;
  o.max_transfer = 64 << 10;                        // 17 entries at most: window 496
  auto buf = model->Allocate(1100 * 4096).value();  // more than two list windows
  auto region = RegisteredRegion::Create(o, *buf, model.get()).value();
  const RegionDescriptor& d = region->descriptor();
  EXPECT_EQ(d.prp_window, 512u - 17 + 1);
  EXPECT_EQ(region->list_bytes(), 3u * 4096);
  for (uint64_t page = 0; page < 1100; ++page) {
    for (uint32_t pages : {1u, 2u, 3u, 16u}) {
      if (page + pages > 1100) continue;
      Sqe e = {};
      ASSERT_TRUE(BuildDataPointer(d, page * 4096, pages * 4096, &e));
      EXPECT_EQ(e.dptr[0], buf->iova() + page * 4096);
      if (pages == 1) {
        EXPECT_EQ(e.dptr[1], 0u);
      } else if (pages == 2) {
        EXPECT_EQ(e.dptr[1], buf->iova() + (page + 1) * 4096);
      }
      if (pages < 3) continue;
      ASSERT_EQ(e.dptr[1] % 8, 0u);
      EXPECT_LE(e.dptr[1] % 4096 + (pages - 1) * 8, 4096u) << "list runs past its page at " << page;
      auto* list = reinterpret_cast<uint64_t*>(model->Translate(e.dptr[1], (pages - 1) * 8));
      ASSERT_NE(list, nullptr);
      for (uint32_t i = 0; i + 1 < pages; ++i) {
        ASSERT_EQ(list[i], buf->iova() + (page + 1 + i) * 4096) << page << "+" << i;
      }
    }
  }
}

TEST(DescriptorsTest, MemoryCostOfEachForm) {
  const uint64_t k60GiB = 60ull << 30;
  DescriptorOptions sgl{true, 12, 128 << 10};
  DescriptorOptions prp{false, 12, 128 << 10};
  EXPECT_EQ(DescriptorMemoryBytes(sgl, k60GiB), 0u) << "SGL data blocks ride in the SQE";
  // 15.7 M pages, window 512 - 33 + 1 = 480: 32.8 K list pages, 128 MiB.
  EXPECT_EQ(DescriptorMemoryBytes(prp, k60GiB), ((k60GiB / 4096 + 479) / 480) * 4096);
  EXPECT_LT(DescriptorMemoryBytes(prp, k60GiB), 130ull << 20);
  // The paper's scheme for comparison: a 4 KiB list page per 64 KiB unit, or a 16-byte SGL each.
  EXPECT_EQ(k60GiB / (64 << 10) * 4096, 3840ull << 20);  // 3.75 GiB
  EXPECT_EQ(k60GiB / (64 << 10) * 16, 15ull << 20);      // 15 MiB
  DescriptorOptions too_big{false, 12, 4 << 20};
  auto model = ControllerModel::Create(ModelOptions{}).value();
  auto buf = model->Allocate(1 << 20).value();
  EXPECT_EQ(RegisteredRegion::Create(too_big, *buf, model.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StatusTextTest, WordsAndErrno) {
  EXPECT_EQ(StatusText(kStatusLbaOutOfRange), "SCT 0 SC 0x80 (LBA Out of Range)");
  EXPECT_EQ(StatusText(MakeStatus(kSctMedia, 0x81)), "SCT 2 SC 0x81 (Unrecovered Read Error)");
  EXPECT_EQ(StatusText(MakeStatus(7, 0xee)), "SCT 7 SC 0xee (unknown)");
  EXPECT_EQ(StatusToErrno(kStatusSuccess), 0);
  EXPECT_EQ(StatusToErrno(kStatusLbaOutOfRange), EINVAL);
  EXPECT_EQ(StatusToErrno(kStatusInternalError), EIO);
  EXPECT_EQ(StatusToErrno(kStatusAbortRequested), ECANCELED);
  EXPECT_EQ(StatusToErrno(kStatusCapacityExceeded), ENOSPC);
  Cqe c{0, 0, 0, CqeDw3(513, 1, kStatusUnrecoveredRead)};
  EXPECT_EQ(CqeCid(c.dw3), 513);
  EXPECT_EQ(CqePhase(c.dw3), 1u);
  EXPECT_EQ(CqeStatus(c.dw3), kStatusUnrecoveredRead);
}

}  // namespace
}  // namespace tutti::io::nvme
