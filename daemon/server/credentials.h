// Credentials issued by the handoff socket (common/handoff.h) and redeemed by Attach.
//
// A credential is 16 random bytes standing for the peer the kernel named (pid, uid, gid) and the
// descriptors it handed over. It is redeemed at most once and expires ttl_ms after issue; its
// descriptors are closed when it expires, or by the caller once redeemed. Bounded: at most
// max_outstanding credentials in all and max_per_uid per user await redemption.
//
// Thread-safety: every method is thread-safe.
#ifndef TUTTI_DAEMON_SERVER_CREDENTIALS_H_
#define TUTTI_DAEMON_SERVER_CREDENTIALS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/stats.h"
#include "common/unique_fd.h"

namespace tutti::server {

// Who is on the other end of a unix socket, as the kernel says (SO_PEERCRED).
struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

struct Credential {
  Peer peer;
  std::vector<UniqueFd> fds;  // in the order the engine sent them
};

class CredentialTable {
 public:
  struct Options {
    uint32_t ttl_ms = 30000;
    uint32_t max_outstanding = 256;
    uint32_t max_per_uid = 32;
  };
  // `clock` must outlive the table.
  CredentialTable(const Options& options, Clock* clock);

  // Files `fds` under a new credential for `peer` and returns it (kCredentialBytes bytes).
  // RESOURCE_EXHAUSTED (naming the limit) when max_outstanding or this uid's max_per_uid are
  // waiting; `fds` are closed then. INTERNAL if the system has no randomness to give.
  absl::StatusOr<std::string> Issue(const Peer& peer, std::vector<UniqueFd> fds);

  // Takes the credential out of the table. PERMISSION_DENIED for an unknown, already redeemed or
  // expired one (the message says to hand over again).
  absl::StatusOr<Credential> Redeem(absl::string_view token);

  // Drops expired credentials, closing their descriptors. Returns how many. Issue calls it too.
  uint32_t Reap();

  uint32_t outstanding() const;

 private:
  struct Entry {
    Credential credential;
    int64_t expires_ms = 0;
  };
  uint32_t ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, uint32_t> per_uid_ ABSL_GUARDED_BY(mu_);
};

// The handoff's figures in the stats registry (common/stats.h): tutti_handoffs_outstanding, read
// from `outstanding` (CredentialTable::outstanding) at each collection.
void RegisterHandoffStats(std::function<uint32_t()> outstanding, stats::Registry* registry);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_CREDENTIALS_H_
