// Namespaces with owners (namespaces.cc): the per-user and global bounds, idle namespaces dropped
// to make room (durably: after a restart from the journal alone, and from a checkpoint), claims,
// RemoveNamespace, and the writer keeping each owner within its pool share by evicting the
// owner's own least recently used blocks.
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/block_store.h"
#include "daemon/store/store_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

constexpr uint32_t kLayers = 2;
constexpr uint32_t kObjects = 2 * kLayers;
constexpr uint32_t kObjectLen = 2048;
constexpr uint32_t kFrame = 4096;

Key K(uint32_t i) { return testing::TestKey(i); }

NamespaceScope UserScope(uint32_t uid) { return {absl::StrCat("uid:", uid), uid, false}; }

// One framed journal record (JOURNAL.md): length, type, payload, XXH3 of type and payload.
std::string Record(uint32_t type, const std::string& payload) {
  auto u32 = [](uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  const std::string typed = u32(type) + payload;
  const uint64_t sum = XXH3_64bits(typed.data(), typed.size());
  return u32(static_cast<uint32_t>(payload.size())) + typed +
         std::string(reinterpret_cast<const char*>(&sum), 8);
}

class NamespacesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/namespaces_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    state_dir_ = root_ + "/state";
    fs::create_directories(state_dir_);
    auto layout = pool::PoolLayout::Compute(4ull << 20, 1, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    testing::UseTestPool(&options_, *layout, state_dir_);
    disk_ = testing::TestDisk(options_.layout);
    ASSERT_NE(disk_, nullptr);
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(root_);
  }

  void Open(const std::string& state_dir = "") {
    store_.reset();
    StoreOptions o = options_;
    if (!state_dir.empty()) o.state_dir = state_dir;
    auto store = BlockStore::Open(o, io::MemoryBackend::CreateOn(disk_), &clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
  }

  NamespaceSessions Sessions() {
    return [this] { return sessions_; };
  }

  // Registers model `model` for `scope`, the claim ended at once (as after a session opened).
  absl::StatusOr<NamespaceId> Register(const std::string& model, const NamespaceScope& scope) {
    auto claim =
        store_->RegisterNamespace(testing::TestNamespace(kLayers, 1, model), scope, Sessions());
    if (!claim.ok()) return claim.status();
    return claim->id();
  }

  std::vector<CaptureOutcome> Store(NamespaceId ns, uint32_t first, uint32_t n) {
    std::vector<Key> keys;
    for (uint32_t i = first; i < first + n; ++i) keys.push_back(K(i));
    auto gather = [](absl::Span<const engine::CopyOp> ops) {
      for (const engine::CopyOp& op : ops) memset(op.staging, 7, kObjectLen);
      return absl::OkStatus();
    };
    auto out = store_->Capture(ns, keys, 0, kLayers, gather, /*wait_durable=*/true);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<CaptureOutcome>();
  }

  bool Present(NamespaceId ns, uint32_t key) {
    const Key k = K(key);
    if (store_->LookupAndPin(ns, absl::MakeConstSpan(&k, 1)) == 0) return false;
    store_->Unpin(ns, absl::MakeConstSpan(&k, 1));
    return true;
  }

  std::vector<NamespaceId> Kept() {
    std::vector<NamespaceId> ids;
    for (const NamespaceInfo& n : store_->Stats().namespaces) ids.push_back(n.id);
    return ids;
  }

  std::string root_, state_dir_;
  StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  absl::flat_hash_map<NamespaceId, uint32_t> sessions_;  // what the "server" counts
};

TEST_F(NamespacesTest, TheScopeMakesTheIdAndTheOwnerIsKept) {
  Open();
  auto mine = Register("m", UserScope(7));
  auto theirs = Register("m", UserScope(8));
  auto legacy = store_->RegisterNamespace(testing::TestNamespace(kLayers, 1, "m"));
  ASSERT_TRUE(mine.ok() && theirs.ok() && legacy.ok());
  EXPECT_NE(*mine, *theirs);
  EXPECT_NE(*mine, *legacy);
  EXPECT_EQ(*Register("m", UserScope(7)), *mine);
  EXPECT_EQ(*Register("m", NamespaceScope{"", 9, true}), *legacy) << "host sharing: the old id";
  Open();  // from the checkpoint
  auto info = store_->GetNamespace(*mine);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->owner_uid, 7u);
  EXPECT_FALSE(info->shared);
  EXPECT_EQ(info->scope, "uid:7");
  EXPECT_TRUE(store_->GetNamespace(*legacy)->shared);
}

// A journal of a tuttid from before owners (a type 2 namespace record): the namespace comes back
// shared by every user (owner 0), with its old id, which host sharing still reaches and a user's
// scope does not.
TEST_F(NamespacesTest, ANamespaceJournaledBeforeOwnersIsReadAsSharedWithItsOldId) {
  const tutti::v1::Namespace ns = testing::TestNamespace(kLayers, 1, "old");
  Open();
  auto legacy_id = store_->RegisterNamespace(ns);  // the id such a tuttid gave it
  ASSERT_TRUE(legacy_id.ok());
  store_.reset();
  fs::remove_all(state_dir_);
  fs::create_directories(state_dir_);
  uint64_t id = *legacy_id;
  std::string header = "TUTTIJNL";
  const uint32_t version = 1, kind = 0;
  const uint64_t gen = 1;
  header.append(reinterpret_cast<const char*>(&version), 4);
  header.append(reinterpret_cast<const char*>(&kind), 4);
  header.append(reinterpret_cast<const char*>(&gen), 8);
  std::ofstream(state_dir_ + "/journal.1", std::ios::binary)
      << Record(1, header)
      << Record(2, std::string(reinterpret_cast<const char*>(&id), 8) + ns.SerializeAsString());
  Open();
  auto info = store_->GetNamespace(id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->shared);
  EXPECT_EQ(info->owner_uid, 0u);
  EXPECT_EQ(info->scope, "");
  EXPECT_EQ(*Register("old", NamespaceScope{"", 5, true}), id);
  EXPECT_NE(*Register("old", UserScope(5)), id);
  Open();  // now from a checkpoint of type 10 records
  EXPECT_TRUE(store_->GetNamespace(id)->shared);
}

TEST_F(NamespacesTest, AUserPastItsBoundIsRefusedNamingItAndOthersAreNot) {
  options_.max_namespaces_per_user = 2;
  Open();
  auto a = Register("a", UserScope(7));
  auto b = Register("b", UserScope(7));
  ASSERT_TRUE(a.ok() && b.ok());
  sessions_[*a] = 1;
  sessions_[*b] = 1;
  auto c = Register("c", UserScope(7));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("limits.max_namespaces_per_user"));
  EXPECT_TRUE(Register("c", UserScope(8)).ok());
  // A namespace with blocks is not idle either.
  sessions_.erase(*a);
  for (CaptureOutcome o : Store(*a, 0, 1)) ASSERT_EQ(o, CaptureOutcome::kDurable);
  EXPECT_EQ(Register("c", UserScope(7)).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(NamespacesTest, AClaimedNamespaceIsNotDropped) {
  options_.max_namespaces = 1;
  Open();
  auto claim =
      store_->RegisterNamespace(testing::TestNamespace(kLayers, 1, "a"), UserScope(7), Sessions());
  ASSERT_TRUE(claim.ok());
  EXPECT_EQ(Register("b", UserScope(8)).status().code(), absl::StatusCode::kResourceExhausted);
  const NamespaceId a = claim->id();
  { NamespaceClaim ended = std::move(claim).value(); }
  auto b = Register("b", UserScope(8));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(Kept(), UnorderedElementsAreArray({*b}));
  EXPECT_EQ(store_->GetNamespace(a).status().code(), absl::StatusCode::kNotFound);
}

// The global bound: an idle namespace of anyone gives its place, and the drop is durable.
TEST_F(NamespacesTest, IdleNamespacesDroppedForNewOnesStayDroppedAfterARestart) {
  options_.max_namespaces = 2;
  options_.checkpoint_every = 1u << 30;  // nothing but the journal until the store closes
  Open();
  auto a = Register("a", UserScope(7));
  auto b = Register("b", UserScope(8));
  ASSERT_TRUE(a.ok() && b.ok());
  for (CaptureOutcome o : Store(*b, 0, 2)) ASSERT_EQ(o, CaptureOutcome::kDurable);
  auto c = Register("c", UserScope(9));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(Kept(), UnorderedElementsAreArray({*b, *c}));
  EXPECT_EQ(store_->Stats().namespaces_dropped, 1u);
  // A crash: a copy of the state directory as it is now (journal only), opened alone.
  const std::string crashed = root_ + "/crashed";
  fs::copy(state_dir_, crashed);
  Open(crashed);
  EXPECT_THAT(Kept(), UnorderedElementsAreArray({*b, *c}));
  EXPECT_TRUE(Present(*b, 0));
  // And a clean restart, from the checkpoint the first restart wrote at its close.
  Open(crashed);
  EXPECT_THAT(Kept(), UnorderedElementsAreArray({*b, *c}));
  // Full of namespaces that hold blocks or sessions: refused, naming the limit.
  sessions_[*c] = 1;
  auto d = Register("d", UserScope(10));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(d.status().message(), HasSubstr("limits.max_namespaces"));
}

TEST_F(NamespacesTest, RemoveNamespaceEvictsItsBlocksAndForgetsItForGood) {
  Open();
  auto a = Register("a", UserScope(7));
  auto b = Register("b", UserScope(7));
  ASSERT_TRUE(a.ok() && b.ok());
  for (CaptureOutcome o : Store(*a, 0, 3)) ASSERT_EQ(o, CaptureOutcome::kDurable);
  for (CaptureOutcome o : Store(*b, 10, 1)) ASSERT_EQ(o, CaptureOutcome::kDurable);
  sessions_[*a] = 1;
  auto refused = store_->RemoveNamespace(*a, Sessions());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("sessions attached"));
  sessions_.erase(*a);
  const Key k0 = K(0);
  ASSERT_EQ(store_->LookupAndPin(*a, absl::MakeConstSpan(&k0, 1)), 1u);
  refused = store_->RemoveNamespace(*a, Sessions());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("1 blocks pinned"));
  EXPECT_TRUE(Present(*a, 1)) << "a refused removal removes nothing";
  store_->Unpin(*a, absl::MakeConstSpan(&k0, 1));
  auto removed = store_->RemoveNamespace(*a, Sessions());
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->evicted, 3u);
  EXPECT_THAT(Kept(), UnorderedElementsAreArray({*b}));
  EXPECT_EQ(store_->RemoveNamespace(*a, Sessions()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats().slots_used, 1u);
  Open();
  EXPECT_THAT(Kept(), UnorderedElementsAreArray({*b}));
  EXPECT_TRUE(Present(*b, 10));
  // Registered again, it starts empty.
  ASSERT_EQ(*Register("a", UserScope(7)), *a);
  EXPECT_FALSE(Present(*a, 0));
}

TEST_F(NamespacesTest, AnOwnerPastItsPoolShareEvictsItsOwnOldestBlocksNotOthers) {
  options_.pool_share_per_user = 0.25;
  Open();
  const uint64_t slots = store_->Stats().slots_total;
  const uint32_t bound = static_cast<uint32_t>(slots / 4);
  ASSERT_GE(bound, 8u);
  auto mine = Register("a", UserScope(7));
  auto theirs = Register("a", UserScope(8));
  ASSERT_TRUE(mine.ok() && theirs.ok());
  for (CaptureOutcome o : Store(*theirs, 1000, 4)) ASSERT_EQ(o, CaptureOutcome::kDurable);
  for (CaptureOutcome o : Store(*mine, 0, bound)) ASSERT_EQ(o, CaptureOutcome::kDurable);
  ASSERT_TRUE(Present(*mine, 0));  // key 0 is now the most recently used of mine
  for (CaptureOutcome o : Store(*mine, bound, 3)) ASSERT_EQ(o, CaptureOutcome::kDurable);
  EXPECT_LT(store_->Stats().slots_used, slots) << "evicted with free slots left";
  EXPECT_TRUE(Present(*mine, 0));
  for (uint32_t k : {1, 2, 3}) EXPECT_FALSE(Present(*mine, k)) << k;
  for (uint32_t k = 4; k < bound + 3; ++k) EXPECT_TRUE(Present(*mine, k)) << k;
  for (uint32_t k = 1000; k < 1004; ++k) EXPECT_TRUE(Present(*theirs, k)) << k;
  EXPECT_EQ(store_->Stats().share_evictions, 3u);
  // Every block of its own pinned: the new one is refused, naming nothing else's.
  std::vector<Key> all;
  for (uint32_t k = 0; k < bound + 3; ++k) {
    if (k < 1 || k > 3) all.push_back(K(k));
  }
  ASSERT_EQ(store_->LookupAndPin(*mine, all), all.size());
  const std::vector<CaptureOutcome> refused = Store(*mine, 5000, 1);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0], CaptureOutcome::kRejectedShare);
  EXPECT_EQ(store_->Stats().store_rejected_share, 1u);
  store_->Unpin(*mine, all);
  for (CaptureOutcome o : Store(*theirs, 2000, 2)) EXPECT_EQ(o, CaptureOutcome::kDurable);
}

}  // namespace
}  // namespace tutti::store
