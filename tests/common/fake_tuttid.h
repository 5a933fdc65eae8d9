// An in-process stand-in for tuttid, for tests of the client side (the bench workloads,
// tuttictl): the KvCache and Admin services over an in-memory key -> block map, serving host-shm
// engines on a unix socket. It validates little; it exists to check what the client sends and
// does with the answers, including the fault cases (corrupt data, failed blocks, full staging).
//
// Thread-safety: all methods are thread-safe.
#ifndef TUTTI_TESTS_COMMON_FAKE_TUTTID_H_
#define TUTTI_TESTS_COMMON_FAKE_TUTTID_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace tutti::testing {

class FakeTuttid {
 public:
  // Serves on unix socket `socket_path` (removed first if present). INTERNAL if it cannot bind.
  static absl::StatusOr<std::unique_ptr<FakeTuttid>> Start(const std::string& socket_path);
  ~FakeTuttid();

  // Fault injection: the next Retrieve flips one byte of its first block's first object.
  void CorruptNextRetrieve();
  // Retrieve reports the block of `key` failed (at layer 0), every time.
  void FailKey(const Key& key);
  // The next `n` blocks offered to Store are answered STORE_REJECTED_FULL.
  void RejectNextStores(int n);
  // Every Store is answered with this gRPC error code (0: none).
  void FailStoresWith(int grpc_code);
  // The next Verify finds one stored block bad (the first in key order) and drops it.
  void CorruptOneBlockForVerify();

  uint64_t blocks() const;
  uint64_t store_calls() const;
  uint64_t keepalives() const;
  uint64_t sessions() const;

  class Impl;

 private:
  explicit FakeTuttid(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::testing

#endif  // TUTTI_TESTS_COMMON_FAKE_TUTTID_H_
