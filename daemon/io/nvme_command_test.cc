#include "daemon/io/nvme_command.h"

#include <cerrno>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::io::nvme_cmd {
namespace {

// Identify data of a namespace of `lbas` LBAs in format `format` of the given formats
// (each {metadata bytes, lbads}), and of a controller with `mdts` and `vwc`.
struct IdentifyData {
  std::vector<uint8_t> ns = std::vector<uint8_t>(kIdentifyBytes, 0);
  std::vector<uint8_t> ctrl = std::vector<uint8_t>(kIdentifyBytes, 0);
};

IdentifyData Make(uint64_t lbas, uint32_t format, std::vector<std::pair<uint16_t, uint8_t>> lbafs,
                  uint8_t mdts, bool vwc) {
  IdentifyData d;
  for (int i = 0; i < 8; ++i) d.ns[i] = static_cast<uint8_t>(lbas >> (8 * i));
  d.ns[25] = static_cast<uint8_t>(lbafs.size() - 1);  // NLBAF is 0-based
  d.ns[26] = static_cast<uint8_t>((format & 0xf) | ((format >> 4) << 5));
  for (size_t i = 0; i < lbafs.size(); ++i) {
    uint8_t* p = &d.ns[128 + 4 * i];
    p[0] = lbafs[i].first & 0xff;
    p[1] = lbafs[i].first >> 8;
    p[2] = lbafs[i].second;
  }
  d.ctrl[77] = mdts;
  d.ctrl[525] = vwc ? 1 : 0;
  return d;
}

TEST(ParseIdentifyTest, ReadsSizeLbaFormatCacheAndTransferLimit) {
  // QEMU's emulated controller by default: 512-byte LBAs, MDTS 7, a volatile write cache.
  IdentifyData d = Make(2097152, 0, {{0, 9}, {0, 12}}, 7, true);
  auto g = ParseIdentify(d.ns.data(), d.ctrl.data(), 1, 256 << 10, "/dev/ng0n1");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->nsid, 1u);
  EXPECT_EQ(g->lba_bytes, 512u);
  EXPECT_EQ(g->lbas, 2097152u);
  EXPECT_EQ(g->bytes(), 1ull << 30);
  EXPECT_TRUE(g->volatile_write_cache);
  EXPECT_EQ(g->max_transfer_bytes, 256u << 10);  // the cap: MDTS 7 allows 512 KiB

  d = Make(1000, 1, {{0, 9}, {0, 12}}, 5, false);
  g = ParseIdentify(d.ns.data(), d.ctrl.data(), 3, 256 << 10, "dev");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->lba_bytes, 4096u);
  EXPECT_EQ(g->bytes(), 1000u * 4096);
  EXPECT_FALSE(g->volatile_write_cache);
  EXPECT_EQ(g->max_transfer_bytes, 128u << 10);  // MDTS 5: 2^5 x 4 KiB
}

TEST(ParseIdentifyTest, MdtsZeroMeansNoLimitButCommandsStayUnder65536Lbas) {
  IdentifyData d = Make(1 << 20, 0, {{0, 9}}, 0, false);
  auto g = ParseIdentify(d.ns.data(), d.ctrl.data(), 1, 64 << 20, "dev");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->max_transfer_bytes, 65536u * 512);
}

TEST(ParseIdentifyTest, FormatIndexUsesHighBitsWithMoreThan16Formats) {
  std::vector<std::pair<uint16_t, uint8_t>> lbafs(20, {0, 9});
  lbafs[17] = {0, 12};
  IdentifyData d = Make(100, 17, lbafs, 0, false);
  auto g = ParseIdentify(d.ns.data(), d.ctrl.data(), 1, 1 << 20, "dev");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->lba_bytes, 4096u);
}

TEST(ParseIdentifyTest, RefusesMetadataOddLbaSizesAndEmptyNamespaces) {
  IdentifyData d = Make(100, 0, {{8, 9}}, 0, false);
  auto g = ParseIdentify(d.ns.data(), d.ctrl.data(), 1, 1 << 20, "/dev/ng1n1");
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(g.status().message().find("/dev/ng1n1"), std::string::npos);
  EXPECT_NE(g.status().message().find("metadata"), std::string::npos);
  d = Make(100, 0, {{0, 13}}, 0, false);  // 8 KiB LBAs
  EXPECT_EQ(ParseIdentify(d.ns.data(), d.ctrl.data(), 1, 1 << 20, "d").status().code(),
            absl::StatusCode::kFailedPrecondition);
  d = Make(0, 0, {{0, 9}}, 0, false);
  EXPECT_EQ(ParseIdentify(d.ns.data(), d.ctrl.data(), 1, 1 << 20, "d").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LbaRangeTest, MapsBytesToLbasAndChecksAlignmentAndRange) {
  Geometry g{1, 512, 2048, false, 1 << 20};  // 1 MiB namespace
  LbaRange r;
  ASSERT_TRUE(ToLbaRange(g, 8192, 4096, g.bytes(), &r));
  EXPECT_EQ(r.slba, 16u);
  EXPECT_EQ(r.count, 8u);
  ASSERT_TRUE(ToLbaRange(g, g.bytes() - 512, 512, g.bytes(), &r));  // the last LBA
  EXPECT_EQ(r.slba, 2047u);
  EXPECT_FALSE(ToLbaRange(g, 100, 512, g.bytes(), &r));                // unaligned offset
  EXPECT_FALSE(ToLbaRange(g, 0, 1000, g.bytes(), &r));                 // unaligned length
  EXPECT_FALSE(ToLbaRange(g, 0, 0, g.bytes(), &r));                    // empty
  EXPECT_FALSE(ToLbaRange(g, g.bytes(), 512, g.bytes(), &r));          // past the end
  EXPECT_FALSE(ToLbaRange(g, g.bytes() - 512, 1024, g.bytes(), &r));   // straddles the end
  EXPECT_TRUE(ToLbaRange(g, g.bytes(), 512, g.bytes() + 4096, &r));    // a test's wider limit
  EXPECT_EQ(r.slba, 2048u);
  Geometry big{1, 512, 1ull << 40, false, 1 << 20};
  EXPECT_FALSE(ToLbaRange(big, 0, 65537 * 512, big.bytes(), &r));  // NLB is 16 bits
  ASSERT_TRUE(ToLbaRange(big, (1ull << 33) * 512, 65536 * 512, big.bytes(), &r));
  EXPECT_EQ(r.slba, 1ull << 33);
  EXPECT_EQ(r.count, 65536u);
}

TEST(CommandTest, EncodesReadWriteIdentifyAndFlush) {
  alignas(4096) static uint8_t buf[4096];
  const nvme_uring_cmd c = MakeIoCommand(kOpRead, 7, LbaRange{0x123456789aull, 8}, buf, 4096);
  EXPECT_EQ(c.opcode, 0x02);
  EXPECT_EQ(c.nsid, 7u);
  EXPECT_EQ(c.addr, reinterpret_cast<uintptr_t>(buf));
  EXPECT_EQ(c.data_len, 4096u);
  EXPECT_EQ(c.cdw10, 0x3456789au);  // SLBA low
  EXPECT_EQ(c.cdw11, 0x12u);        // SLBA high
  EXPECT_EQ(c.cdw12, 7u);           // NLB, 0-based
  EXPECT_EQ(c.metadata, 0u);
  EXPECT_EQ(MakeIoCommand(kOpWrite, 1, {0, 1}, buf, 512).opcode, 0x01);
  const nvme_passthru_cmd id = MakeIdentify(kCnsController, 0, buf);
  EXPECT_EQ(id.opcode, 0x06);
  EXPECT_EQ(id.cdw10, 1u);
  EXPECT_EQ(id.data_len, 4096u);
  const nvme_passthru_cmd f = MakeFlush(3);
  EXPECT_EQ(f.opcode, 0x00);
  EXPECT_EQ(f.nsid, 3u);
  EXPECT_EQ(f.data_len, 0u);
}

TEST(StatusTest, DecodesAndMapsControllerStatuses) {
  // What QEMU answers for a read past the namespace's end (tests/vm: FACTS.md).
  const Status s = DecodeStatus(0x4080);
  EXPECT_EQ(s.sct, 0);
  EXPECT_EQ(s.sc, 0x80);
  EXPECT_TRUE(s.dnr);
  EXPECT_FALSE(s.more);
  EXPECT_EQ(StatusToErrno(0x4080), -ERANGE);
  EXPECT_EQ(StatusText(0x4080),
            "NVMe status 0x4080 (SCT 0x0 generic, SC 0x80 LBA out of range, DNR)");
  EXPECT_EQ(StatusToErrno(0x0002), -EINVAL);
  EXPECT_EQ(StatusToErrno(0x0001), -EOPNOTSUPP);
  EXPECT_EQ(StatusToErrno(0x0081), -ENOSPC);
  EXPECT_EQ(StatusToErrno(0x0281), -EIO);  // unrecovered read error
  EXPECT_EQ(StatusToErrno(0x0286), -EACCES);
  EXPECT_EQ(StatusToErrno(0x0106), -EIO);  // command specific
  EXPECT_NE(StatusText(0x0281).find("SCT 0x2 media and data integrity, SC 0x81 unrecovered read "
                                    "error"),
            std::string::npos);
}

}  // namespace
}  // namespace tutti::io::nvme_cmd
