// The "second_sight" admission policy (admission.h): a block is written on its second sight,
// within a bounded ghost of recently seen keys. With `dram_front`, the same ghost is the
// "dram_front" policy's (the store keeps what it declines in DRAM). Private to daemon/store (made by
// MakeAdmissionPolicy); the header is here for its test.
//
// Memory: one list node and one hash entry per remembered key (a 64-bit hash of namespace and key:
// two keys share a ghost entry with probability about 2^-64), about 50 bytes a key.
// Thread-safety: thread-safe.
#ifndef TUTTI_DAEMON_STORE_SECOND_SIGHT_H_
#define TUTTI_DAEMON_STORE_SECOND_SIGHT_H_

#include <cstdint>
#include <list>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/store/admission.h"

namespace tutti::store {

class SecondSight final : public AdmissionPolicy {
 public:
  // Precondition: ghost_blocks > 0.
  explicit SecondSight(uint64_t ghost_blocks, bool dram_front = false)
      : capacity_(ghost_blocks), dram_front_(dram_front) {}
  // True when (ns, key) is in the ghost; either way it becomes the ghost's most recent key, and
  // the least recent one goes when the ghost would pass ghost_blocks.
  bool Admit(NamespaceId ns, const Key& key) override;
  std::string_view name() const override {
    return dram_front_ ? "dram_front" : "second_sight";
  }
  bool keeps_declined_in_dram() const override { return dram_front_; }
  // Keys remembered now (at most ghost_blocks).
  uint64_t size() const;

 private:
  const uint64_t capacity_;
  const bool dram_front_;
  mutable absl::Mutex mu_;
  std::list<uint64_t> order_ ABSL_GUARDED_BY(mu_);  // least recently seen first
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> ghost_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_SECOND_SIGHT_H_
