// The eviction policy: which cached block goes first when room is needed. One interface, used by
// every cache of the store: the pool index (ids are slot numbers, daemon/store/index.h), the DRAM
// tier and the DRAM front (ids are chunk numbers, daemon/store/dram_tier.h, dram_front.h).
//
// A cache names what it holds by dense ids in [0, capacity) and tells its policy every change:
//   Insert(id)  id now holds a block, used just now. Precondition: id is not held.
//   Touch(id)   id's block was used again (a lookup found it). Precondition: id is held.
//   Erase(id)   id no longer holds a block (evicted or removed). Precondition: id is held.
// and asks it for a victim:
//   Victim(eligible)  the held id to evict first among those for which eligible(id) is true, or
//                     kNone if there is none. It does not erase it: the cache does, with Erase,
//                     once the block is gone. `eligible` is called on held ids only, in the order
//                     the policy would evict them, until it returns true; it must not call back
//                     into the policy. The caches pass "not pinned" (and the pool's per-user
//                     shares "owned by this user"), so a policy must not assume every id is
//                     eligible.
// The calls come in the order the uses happened, and recovery relies on that: it rebuilds the
// order of a restarted pool by inserting its blocks oldest last use first (Index::OrderByLastUse),
// so a policy must treat a sequence of Inserts as a sequence of uses. A policy keeps no state
// but what the calls give it: no clock, no thread, no I/O.
//
// Not thread-safe: the cache that owns it guards it (BlockStore's mu_ for each).
//
// A new policy is one new file, a header-only class deriving from EvictionPolicy named
// *_policy.h like lru_policy.h (the BUILD's glob picks it up), and in eviction_policy.cc its
// #include and the line that chooses it; eviction_policy_test.cc checks today's choice.
#ifndef TUTTI_DAEMON_STORE_EVICTION_POLICY_H_
#define TUTTI_DAEMON_STORE_EVICTION_POLICY_H_

#include <cstdint>
#include <limits>
#include <memory>

#include "absl/functional/function_ref.h"

namespace tutti::store {

class EvictionPolicy {
 public:
  // No id: what Victim returns when no held id is eligible. Ids are below it.
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

  virtual ~EvictionPolicy() = default;
  virtual void Insert(uint32_t id) = 0;
  virtual void Touch(uint32_t id) = 0;
  virtual void Erase(uint32_t id) = 0;
  virtual uint32_t Victim(absl::FunctionRef<bool(uint32_t)> eligible) const = 0;
  // Whether `id` is held (for checks and tests).
  virtual bool Holds(uint32_t id) const = 0;
};

// The policy the store uses, over ids [0, capacity). Precondition: capacity < kNone.
std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(uint32_t capacity);

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_EVICTION_POLICY_H_
