// Recovery, what BlockStore::Open does before the store serves anything (daemon/store only: the
// store and its tests call it).
//
// Reads:
//   - the state directory (StoreOptions::state_dir), through Journal::Open: the last complete
//     checkpoint, then every journal file after it, in append order (JOURNAL.md). Namespace
//     records become namespaces; puts and deletes become index entries, a later record of a key
//     or a slot superseding an earlier one; a checkpoint's put keeps its last use, a journal's
//     counts as used when replayed (JOURNAL.md, record type 6). Puts written under another pool
//     geometry (a slot past the pool, more objects than pool.max_objects) are skipped.
//   - the pool's slot headers, only when the journal recovered no block: the first 1024
//     slots' headers (kProbeSlots, recovery.cc) are read through `backend`, and those that
//     decode are counted (a pool kept while its state directory was removed or replaced).
// Writes nothing to the pool. Journal::Open may write the state directory (it starts a new
// journal generation); see journal.h.
//
// Yields: `index` filled (entries, slot ownership, the eviction policy in last-use order) and a
// RecoveredState: the open journal, the namespaces in the order recovered, the next epoch, and
// what was lost. Logs what it recovered and what it could not keep.
//
// Runs alone: before the store's threads start, with no store lock held (Journal::Open takes
// the journal's own locks, which come before BlockStore's mu_ in the lock order,
// block_store_impl.h).
#ifndef TUTTI_DAEMON_STORE_RECOVERY_H_
#define TUTTI_DAEMON_STORE_RECOVERY_H_

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "daemon/io/io_backend.h"
#include "daemon/store/block_store.h"
#include "daemon/store/index.h"
#include "daemon/store/journal.h"

namespace tutti::store {

struct RecoveredState {
  std::unique_ptr<Journal> journal;  // open: records go on from here
  absl::flat_hash_map<NamespaceId, NamespaceInfo> namespaces;
  // Each namespace's place in the order recovered (0, 1, ...), and the next place.
  absl::flat_hash_map<NamespaceId, uint64_t> registered_order;
  uint64_t next_order = 0;
  uint64_t next_epoch = 1;  // past every epoch the journal holds
  // Blocks the journal held that recovery did not keep (another pool geometry, or a namespace
  // whose record could not be read), or, when the journal held none, the used slot headers found
  // if more: what event subscribers are told (EventHub::SetBlocksLostAtStart).
  uint64_t blocks_lost = 0;
  // Used slot headers found when the journal held no block (StoreStats::unindexed_slot_headers).
  uint64_t unindexed_slot_headers = 0;
};

// Recovers the store of `options` into `index`, which must be empty and used by nothing else
// meanwhile. Errors: Journal::Open's (the state directory cannot be locked, read or trusted).
absl::StatusOr<RecoveredState> RecoverStore(const StoreOptions& options, io::IoBackend* backend,
                                            Index* index);

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_RECOVERY_H_
