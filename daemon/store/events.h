// The event hub: the pool's block events (a block became durable, a block left the pool) per
// namespace, in order, for KvCache.WatchEvents (docs/events.md).
//
// Each namespace has its own sequence, from 1 for every run of tuttid (boot_id), and a ring of its
// last max_pending_events events, so that a subscriber may lag or reconnect and resume. All rings
// together keep at most max_pending_events_total events: past it the oldest events of all (those of
// the namespace whose history reaches back furthest) leave first, so each ring is a suffix of its
// namespace's sequence as before. Memory: about 40 bytes per event kept, so at most about
// 40 x max_pending_events_total bytes, however many namespaces have had events.
//
// The store publishes (BlockStore hooks: block_store.h says when); the WatchEvents handler reads
// through a Cursor. Waiting readers are woken by a condition variable when their namespace gets
// an event, when Shutdown is called, or at the deadline they passed.
//
// Thread-safety: every method is thread-safe. The hub's lock is a leaf: Publish may be called with
// any other lock held (the store calls it under its own), and the hub calls nothing outside.
#ifndef TUTTI_DAEMON_STORE_EVENTS_H_
#define TUTTI_DAEMON_STORE_EVENTS_H_

#include <array>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/types.h"

namespace tutti::store {

enum class BlockEventKind : uint8_t {
  kStored = 1,   // durable in the pool: a Lookup finds it from now on
  kRemoved = 2,  // left the pool: evicted, retired after a failed read or scrub
};

struct BlockEvent {
  uint64_t seq = 0;
  BlockEventKind kind = BlockEventKind::kStored;
  Key key;
};

struct EventHubOptions {
  uint32_t max_pending_events = 65536;  // ring size per namespace (limits.max_pending_events), >= 1
  uint64_t pool_id = 0;  // the pool's identity (PoolIdOf); 0: a random one (a pool made per start)
  uint64_t boot_id = 0;  // this run's identity; 0: a random one (the normal case)
  // Events kept for all namespaces together (limits.max_pending_events_total), >= 1.
  uint64_t max_pending_events_total = 1ull << 20;
};

// The pool id of a pool uuid: its first 8 bytes, big-endian, so that its 16 hex digits are the
// first 16 of the uuid's (pool::PoolFiles::UuidHex).
uint64_t PoolIdOf(const std::array<uint8_t, 16>& uuid);

class EventHub {
 public:
  // Where one subscriber stands in one namespace's sequence: it has seen every event up to
  // `after_seq`. Owned by the subscriber; passed back to Next.
  struct Cursor {
    NamespaceId ns = 0;
    uint64_t after_seq = 0;
  };

  explicit EventHub(const EventHubOptions& options);
  EventHub(const EventHub&) = delete;
  EventHub& operator=(const EventHub&) = delete;

  uint64_t pool_id() const { return pool_id_; }
  uint64_t boot_id() const { return boot_id_; }
  uint32_t max_pending_events() const { return max_pending_; }
  uint64_t max_pending_events_total() const { return max_total_; }
  // Durable blocks the previous run had that this start did not keep (the store sets it once,
  // during recovery, before anyone subscribes).
  uint64_t blocks_lost_at_start() const;
  void SetBlocksLostAtStart(uint64_t blocks);

  // Appends one event of `kind` for `key` to namespace `ns`'s sequence (the next seq) and wakes
  // that namespace's waiters. The oldest event leaves a full ring; with max_pending_events_total
  // kept in all, the oldest event of all leaves too. O(log namespaces).
  void Publish(NamespaceId ns, BlockEventKind kind, const Key& key);

  // A cursor for namespace `ns`. Resumes (*resumed = true, the cursor at after_seq) when boot_id is
  // this run's and every event after after_seq is still in the ring (or after_seq is the last
  // one); otherwise the cursor starts after the namespace's last event ("from now on").
  Cursor Subscribe(NamespaceId ns, uint64_t after_seq, uint64_t boot_id, bool* resumed) const;

  // Waits until the cursor's namespace has events after it, Shutdown was called, or `deadline`
  // passes; then appends up to `max_events` of them (in seq order) to *out and advances the
  // cursor. OK with no events at the deadline. RESOURCE_EXHAUSTED (naming
  // limits.max_pending_events, or limits.max_pending_events_total when that one cut the ring
  // shorter) when events after the cursor have already left the ring: the subscriber lagged too
  // far. UNAVAILABLE once Shutdown was called.
  absl::Status Next(Cursor* cursor, absl::Time deadline, size_t max_events,
                    std::vector<BlockEvent>* out);

  // Wakes every waiter; Next answers UNAVAILABLE from now on. Publish still records.
  void Shutdown();

  // The namespace's last seq (0: none yet).
  uint64_t last_seq(NamespaceId ns) const;
  // Events kept now, all namespaces together (<= max_pending_events_total).
  uint64_t events_kept() const;

 private:
  struct Kept {
    BlockEvent event;
    uint64_t order = 0;  // the hub's count of events published, this one included
  };
  struct Ring {
    uint64_t last_seq = 0;
    std::deque<Kept> events;  // seqs last_seq - size + 1 .. last_seq
  };

  // Drops ring `ns`'s oldest event. Precondition: the ring is not empty.
  void DropOldest(NamespaceId ns, Ring& ring) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t max_pending_;
  const uint64_t max_total_;
  const uint64_t pool_id_;
  const uint64_t boot_id_;

  mutable absl::Mutex mu_;
  absl::CondVar published_;
  absl::flat_hash_map<NamespaceId, Ring> rings_ ABSL_GUARDED_BY(mu_);
  uint64_t published_count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t kept_ ABSL_GUARDED_BY(mu_) = 0;  // events in all rings
  // (order of its oldest event, namespace) for every ring that is not empty: the first is where
  // the total cut takes from.
  absl::btree_set<std::pair<uint64_t, NamespaceId>> oldest_ ABSL_GUARDED_BY(mu_);
  uint64_t blocks_lost_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_EVENTS_H_
