// The store's metadata log: which key lives in which slot, made durable before
// a block is visible. Format and recovery rules: daemon/store/JOURNAL.md.
//
// State directory files: "checkpoint" (a full snapshot, replaced atomically by
// rename) and "journal.<gen>" (records appended after the snapshot of
// generation <gen>). Recovery loads the checkpoint, then replays every journal
// file with gen >= the checkpoint's gen, in order, stopping at the first torn
// or corrupt record of each file (a crash mid-append); later files are still
// read.
//
// Thread-safety: not thread-safe; the store calls it from its single writer
// thread (Open and Recover before that thread starts).
#ifndef TUTTI_DAEMON_STORE_JOURNAL_H_
#define TUTTI_DAEMON_STORE_JOURNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/common/types.h"

namespace tutti::store {

// A block became durable in `slot`.
struct PutRecord {
  NamespaceId ns = 0;
  Key key;
  uint64_t slot = 0;
  uint64_t epoch = 0;
  uint32_t object_len = 0;
  std::vector<uint64_t> checksums;  // one per object
};

// The block left its slot (evicted or replaced). After this record is durable
// the slot may be rewritten.
struct DeleteRecord {
  NamespaceId ns = 0;
  Key key;
  uint64_t slot = 0;
  uint64_t epoch = 0;  // the epoch of the Put being deleted
};

// A namespace was seen; `descriptor` is its serialized tutti.v1.Namespace.
struct NamespaceRecord {
  NamespaceId ns = 0;
  std::string descriptor;
};

// Receives recovered state. Records come in the order they were appended.
struct RecoveryVisitor {
  std::function<void(const NamespaceRecord&)> on_namespace;
  std::function<void(const PutRecord&)> on_put;
  std::function<void(const DeleteRecord&)> on_delete;
};

struct RecoveryReport {
  uint64_t records = 0;
  uint64_t torn_tails = 0;  // files that ended in a partial or corrupt record (crash mid-append)
  uint64_t generation = 0;
};

class Journal {
 public:
  // Passed to Checkpoint's `snapshot`.
  class Emitter {
   public:
    virtual ~Emitter() = default;
    virtual void Emit(const NamespaceRecord& r) = 0;
    virtual void Emit(const PutRecord& r) = 0;
  };

  // Opens (creating if absent) the journal in `state_dir`, which must exist.
  // Calls `visitor` for every recovered record before returning. A checkpoint
  // that is present but corrupt is DATA_LOSS: refuse to start rather than serve
  // from a wrong index. Returns the journal ready for appends to a fresh
  // generation file.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& state_dir,
                                                       const RecoveryVisitor& visitor,
                                                       RecoveryReport* report);
  ~Journal();

  // Appends records to the current file's buffer. Not durable until Sync()
  // returns OK.
  void Append(const PutRecord& r);
  void Append(const DeleteRecord& r);
  void Append(const NamespaceRecord& r);

  // Writes buffered records and fdatasyncs the file. On error the records
  // appended since the last successful Sync are not known to be durable: the
  // caller must not publish them.
  [[nodiscard]] absl::Status Sync();

  // Records appended since the last checkpoint.
  uint64_t records_since_checkpoint() const { return records_since_checkpoint_; }

  // Writes a new checkpoint holding exactly the records `snapshot` emits (the
  // live state), starts a new generation file and removes older journal files.
  // `snapshot` is called once, synchronously, and must emit every namespace
  // before any Put of it.
  [[nodiscard]] absl::Status Checkpoint(const std::function<void(Journal::Emitter&)>& snapshot);

 private:
  Journal() = default;
  std::string state_dir_;
  int fd_ = -1;
  uint64_t generation_ = 0;
  uint64_t records_since_checkpoint_ = 0;
  std::string buffer_;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_JOURNAL_H_
