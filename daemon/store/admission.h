// Admission to the SSD: which captured blocks of a Store are written to the pool (issue 23
// section 2, docs/admission.md). The store asks its policy once per new block of a Store (a key
// that is neither in the pool nor being captured or written), in the call's key order; a block
// the policy declines is dropped at once (no staging kept, nothing written or journaled), counted
// (StoreStats::blocks_declined) and answered kDeclined.
//
// Policies, by name (pool.admission):
//   "all"           every block is written (the default; tuttid's behaviour before admission).
//   "second_sight"  a block is written on its second sight: the first Store of a key only records
//                   it in a ghost index of recently seen keys (namespace + key) and is declined;
//                   a Store of a key still in the ghost is admitted. The ghost holds at most
//                   ghost_blocks keys, least recently seen dropped first; a sight (admitted or
//                   not) makes a key the most recently seen. It is bench/trace_policies.py's
//                   SecondSight with Ghost(ghost_blocks).
//   "dram_front"    second sight with a DRAM front (dram_front.h): the ghost decides as in
//                   "second_sight", but the store keeps a block declined at its first sight in
//                   the DRAM tier instead of dropping it, and a block still kept there is
//                   admitted at its next offer (and promoted to the SSD at a Lookup hit). It is
//                   bench/trace_policies.py's DramFront. Needs the DRAM tier (dram.capacity_bytes).
//
// Thread-safety: every policy is thread-safe (its own lock, a leaf: it never calls out).
#ifndef TUTTI_DAEMON_STORE_ADMISSION_H_
#define TUTTI_DAEMON_STORE_ADMISSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace tutti::store {

class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;
  // Whether the new block `key` of namespace `ns`, offered by a Store now, is written to the
  // SSD. Records the sight. Never fails.
  virtual bool Admit(NamespaceId ns, const Key& key) = 0;
  // The policy's name, as configured ("all", "second_sight", "dram_front").
  virtual std::string_view name() const = 0;
  // Whether the store keeps declined blocks in its DRAM front rather than dropping them
  // ("dram_front").
  virtual bool keeps_declined_in_dram() const { return false; }
};

struct AdmissionOptions {
  std::string policy = "all";  // "all", "second_sight" or "dram_front"
  // "second_sight", "dram_front": the most keys the ghost remembers; must be > 0.
  uint64_t ghost_blocks = 0;
};

// The policy `options` names. INVALID_ARGUMENT (naming pool.admission or
// pool.admission_ghost_blocks) for an unknown name, or second_sight or dram_front with
// ghost_blocks == 0.
absl::StatusOr<std::unique_ptr<AdmissionPolicy>> MakeAdmissionPolicy(
    const AdmissionOptions& options);

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_ADMISSION_H_
