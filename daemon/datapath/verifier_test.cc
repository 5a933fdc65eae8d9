#include "daemon/datapath/verifier.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/pool/slot_header.h"
#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr NamespaceId kNs = 42;
constexpr uint32_t kLen = 32768;

Key KeyOf(uint32_t i) {
  Key k;
  std::memset(k.bytes.data(), static_cast<int>(i), Key::kSize);
  return k;
}

// 100 objects, every seventh corrupted after its checksum was taken: exactly those fail, on a
// pool of threads and inline.
void ExpectMismatchesFound(WorkPool* pool) {
  const uint32_t n = 100;
  std::vector<std::vector<uint8_t>> data(n, std::vector<uint8_t>(kLen));
  std::vector<Key> keys(n);
  std::vector<ObjectCheck> checks(n);
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t b = 0; b < kLen; ++b) data[i][b] = static_cast<uint8_t>(i * 7 + b / 64);
    keys[i] = KeyOf(i);
    checks[i] = ObjectCheck{kNs,
                            &keys[i],
                            3,
                            i % 64,
                            data[i].data(),
                            kLen,
                            pool::ObjectChecksum(kNs, keys[i], 3, i % 64, data[i].data(), kLen)};
    if (i % 7 == 0) data[i][kLen / 2] ^= 1;
  }
  std::vector<uint8_t> matches(n, 2);
  auto verifier = MakeCpuVerifier(pool);
  EXPECT_EQ(verifier->name(), "cpu");
  absl::Notification done;
  verifier->Verify(1, checks, absl::MakeSpan(matches), [&] { done.Notify(); });
  done.WaitForNotification();
  for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(matches[i], i % 7 == 0 ? 0 : 1) << i;
}

TEST(CpuVerifierTest, FindsExactlyTheCorruptObjectsOnAPool) {
  WorkPool pool(3, "verify");
  ExpectMismatchesFound(&pool);
}

TEST(CpuVerifierTest, FindsExactlyTheCorruptObjectsInline) { ExpectMismatchesFound(nullptr); }

// A batch of another stream queued behind a long one is checked after one task of the long one,
// not after all of it (the pool's one thread is held until both are queued, so the order is
// exact). The long one is still checked whole.
TEST(CpuVerifierTest, StreamsQueuedAtOnceAreCheckedInTurn) {
  WorkPool pool(1, "verify");
  auto verifier = MakeCpuVerifier(&pool);
  constexpr uint32_t kLong = 20 * 32, kShort = 32;  // twenty tasks of 32 objects, and one
  std::vector<uint8_t> data(4096, 5);
  const Key k = KeyOf(3);
  const uint64_t sum = pool::ObjectChecksum(kNs, k, 1, 0, data.data(), data.size());
  const ObjectCheck check{kNs, &k, 1, 0, data.data(), static_cast<uint32_t>(data.size()), sum};
  std::vector<ObjectCheck> long_checks(kLong, check), short_checks(kShort, check);
  std::vector<uint8_t> long_matches(kLong, 7), short_matches(kShort, 7);
  absl::Notification held, long_done, short_done;
  pool.Schedule([&] { held.WaitForNotification(); });
  int long_checked_before_short = -1;
  verifier->Verify(1, long_checks, absl::MakeSpan(long_matches), [&] { long_done.Notify(); });
  verifier->Verify(2, short_checks, absl::MakeSpan(short_matches), [&] {
    long_checked_before_short =
        static_cast<int>(kLong - std::count(long_matches.begin(), long_matches.end(), 7));
    short_done.Notify();
  });
  held.Notify();
  short_done.WaitForNotification();
  long_done.WaitForNotification();
  EXPECT_EQ(long_checked_before_short, 32);  // one task of the long batch went first
  EXPECT_EQ(std::count(long_matches.begin(), long_matches.end(), kMatch), kLong);
  EXPECT_EQ(std::count(short_matches.begin(), short_matches.end(), kMatch), kShort);
}

TEST(CpuVerifierTest, AWrongIdentityIsAMismatch) {
  std::vector<uint8_t> data(kLen, 9);
  const Key k = KeyOf(1), other = KeyOf(2);
  const uint64_t sum = pool::ObjectChecksum(kNs, k, 1, 0, data.data(), kLen);
  std::vector<ObjectCheck> checks = {
      {kNs, &k, 1, 0, data.data(), kLen, sum},      // right
      {kNs, &other, 1, 0, data.data(), kLen, sum},  // another key's bytes
      {kNs, &k, 2, 0, data.data(), kLen, sum},      // an older epoch
      {kNs, &k, 1, 1, data.data(), kLen, sum},      // another object of the block
  };
  std::vector<uint8_t> matches(checks.size());
  bool ran = false;
  MakeCpuVerifier(nullptr)->Verify(1, checks, absl::MakeSpan(matches), [&] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_EQ(matches, (std::vector<uint8_t>{1, 0, 0, 0}));
}

TEST(CpuVerifierTest, AnEmptyBatchIsDoneAtOnce) {
  bool ran = false;
  MakeCpuVerifier(nullptr)->Verify(1, {}, {}, [&] { ran = true; });
  EXPECT_TRUE(ran);
}

// Answers every object with `answer`, counting the batches it was given.
class FixedVerifier final : public Verifier {
 public:
  explicit FixedVerifier(uint8_t answer) : answer_(answer) {}
  std::string_view name() const override { return answer_ ? "yes" : "no"; }
  void Verify(uint64_t, absl::Span<const ObjectCheck>, absl::Span<uint8_t> matches,
              std::function<void()> done) override {
    ++batches;
    for (uint8_t& m : matches) m = answer_;
    done();
  }
  int batches = 0;

 private:
  const uint8_t answer_;
};

TEST(VerifierSwitchTest, ForwardsToTheVerifierSetLast) {
  FixedVerifier yes(1), no(0);
  VerifierSwitch sw(&yes);
  std::vector<ObjectCheck> checks(3);
  std::vector<uint8_t> matches(3, 7);
  int done = 0;
  sw.Verify(1, checks, absl::MakeSpan(matches), [&] { ++done; });
  EXPECT_EQ(matches, (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(sw.name(), "yes");
  sw.Set(&no);
  sw.Verify(1, checks, absl::MakeSpan(matches), [&] { ++done; });
  EXPECT_EQ(matches, (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_EQ(sw.name(), "no");
  EXPECT_EQ(done, 2);
  EXPECT_EQ(yes.batches, 1);
  EXPECT_EQ(no.batches, 1);
}

}  // namespace
}  // namespace tutti::datapath
