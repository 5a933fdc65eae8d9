// The store's metadata log: which key lives in which slot, made durable before
// a block is visible. Format and recovery rules: daemon/store/JOURNAL.md.
//
// State directory files: "lock" (held with flock for the journal's life, with the
// holder's pid in it), "checkpoint" (a full snapshot, replaced atomically by
// rename) and "journal.<gen>" (records appended after the snapshot of
// generation <gen>). Recovery loads the checkpoint, then replays every journal
// file with gen >= the checkpoint's gen, in order, stopping at the first torn
// or corrupt record of each file (a crash mid-append); later files are still
// read.
//
// Thread-safety: thread-safe. Append takes a short internal lock and never waits
// for a write or an fdatasync; Sync calls run one at a time and each covers every
// record appended before it took the buffer (group commit); Checkpoint excludes
// Sync but not Append. Lock order for callers: Sync and Checkpoint must not be
// called with a lock that Checkpoint's `snapshot` takes; Append may be.
#ifndef TUTTI_DAEMON_STORE_JOURNAL_H_
#define TUTTI_DAEMON_STORE_JOURNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/file_system.h"
#include "common/types.h"

namespace tutti::store {

// A block became durable in `slot`.
struct PutRecord {
  NamespaceId ns = 0;
  Key key;
  uint64_t slot = 0;
  uint64_t epoch = 0;
  uint32_t object_len = 0;
  std::vector<uint64_t> checksums;  // one per object
  // The block's last use (Entry::last_use) when a checkpoint was written; 0 in
  // journal records and in checkpoints of format version 1, which do not keep it.
  uint64_t last_use = 0;
};

// The block left its slot (evicted or replaced). After this record is durable
// the slot may be rewritten.
struct DeleteRecord {
  NamespaceId ns = 0;
  Key key;
  uint64_t slot = 0;
  uint64_t epoch = 0;  // the epoch of the Put being deleted
};

// A namespace was seen; `descriptor` is its serialized tutti.v1.Namespace. Its owner
// (docs/security.md "Namespaces"): `scope` is mixed into its id by the store ("" for namespaces
// shared by every user, as all were before scopes existed), `owner_uid` the user who registered
// it, `shared` whether other users' engines may use it. Records written before owners existed
// (type 2) come back as scope "", owner_uid 0, shared.
struct NamespaceRecord {
  NamespaceId ns = 0;
  std::string descriptor;
  std::string scope;
  uint32_t owner_uid = 0;
  bool shared = true;
};

// The namespace was dropped (empty, or removed by the operator): after this record its id is
// unknown again until a later NamespaceRecord. Its blocks left the index before it was appended.
struct NamespaceDropRecord {
  NamespaceId ns = 0;
};

// Receives recovered state. Records come in the order they were appended.
struct RecoveryVisitor {
  std::function<void(const NamespaceRecord&)> on_namespace;
  std::function<void(const PutRecord&)> on_put;
  std::function<void(const DeleteRecord&)> on_delete;
  std::function<void(const NamespaceDropRecord&)> on_namespace_drop;
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
  // First takes the state directory's lock (flock on "lock", held until the
  // journal is destroyed), before anything is read. Calls `visitor` for every
  // recovered record before returning. Returns the journal ready for appends to
  // a fresh generation file. Errors: FAILED_PRECONDITION if `state_dir` is not a
  // directory or another process (or another open Journal) holds its lock (the
  // message names the directory and the holder's pid); DATA_LOSS for a checkpoint
  // that is present but corrupt, a missing journal file or a foreign one: refuse
  // to start rather than serve from a wrong index; INTERNAL (errno text) for
  // other system call failures. Every file operation goes through `fs`
  // (common/file_system.h; tests pass a FaultFileSystem), which must outlive the
  // journal.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& state_dir,
                                                       const RecoveryVisitor& visitor,
                                                       RecoveryReport* report,
                                                       FileSystem* fs = PosixFileSystem());
  // Releases the lock. Records appended since the last Sync are dropped.
  ~Journal();

  // Appends a record to the buffer and returns its sequence number (1, 2, ...
  // over the journal's life); pass it to Sync. Not durable until Sync covers it.
  uint64_t Append(const PutRecord& r);
  uint64_t Append(const DeleteRecord& r);
  uint64_t Append(const NamespaceRecord& r);
  uint64_t Append(const NamespaceDropRecord& r);

  // Makes records up to sequence number `seq` durable: writes the buffered
  // records and fdatasyncs the current file, unless an earlier Sync already
  // covered `seq`. OK means every record up to `seq` is on disk, in the journal
  // file the state directory names. On error the records of the failed write
  // (which include `seq`) are not known to be durable: the caller must not
  // publish them; the file is abandoned and later records go to a new generation
  // (RESOURCE_EXHAUSTED for ENOSPC, INTERNAL otherwise). After each fdatasync the
  // file and the state directory are checked to be still in place (the file's
  // link count, and the directory entries compared by device and inode): if not,
  // durability is lost for good (see durability()) and this and every later Sync
  // of an unsynced record returns FAILED_PRECONDITION.
  [[nodiscard]] absl::Status Sync(uint64_t seq);
  // Sync of every record appended so far.
  [[nodiscard]] absl::Status Sync();

  // OK, or FAILED_PRECONDITION saying why nothing appended is durable any more:
  // the journal file or the state directory was removed or replaced while open.
  // Sticky until the journal is reopened (a restart of the daemon).
  absl::Status durability() const;

  // Records appended since the last successful checkpoint.
  uint64_t records_since_checkpoint() const;

  // Writes a new checkpoint holding exactly the records `snapshot` emits (the
  // live state), starts a new generation file and removes older journal files.
  // `snapshot` is called once, synchronously, with no internal lock but Sync's
  // held (Appends go on), and must emit every namespace before any Put of it.
  // Every record appended before the call must be reflected in what `snapshot`
  // emits; records appended during it go to the new generation. On error the
  // journal stays usable: if the new generation was created but the snapshot
  // could not be written, appends go on in that generation and the next attempt
  // writes its checkpoint for it without starting another one, so repeated
  // failures add at most one journal file.
  [[nodiscard]] absl::Status Checkpoint(const std::function<void(Journal::Emitter&)>& snapshot);

 private:
  explicit Journal(FileSystem* fs) : fs_(fs) {}
  // Writes `data` to the current file (creating a generation if the last one was
  // abandoned) and fdatasyncs it, then checks that it is still in place.
  absl::Status WriteAndSync(const std::string& data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // Takes the buffer and writes it; records the outcome for the sequence range.
  absl::Status SyncBuffer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // Sets the sticky durability error (logged once) unless the file and the state
  // directory are still those opened.
  absl::Status CheckInPlace() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  absl::Status StartGeneration(uint64_t gen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);

  // The sequence numbers (after, last] of a write that failed.
  struct LostRange {
    uint64_t after = 0, last = 0;
    absl::Status status;
  };

  FileSystem* const fs_;
  std::string state_dir_;
  std::unique_ptr<FileLock> lock_;  // the state directory's
  uint64_t dir_dev_ = 0, dir_ino_ = 0;

  mutable absl::Mutex sync_mu_;  // before append_mu_
  // The current journal file; null after a failed write abandoned it.
  std::unique_ptr<WritableFile> file_ ABSL_GUARDED_BY(sync_mu_);
  uint64_t file_dev_ ABSL_GUARDED_BY(sync_mu_) = 0;
  uint64_t file_ino_ ABSL_GUARDED_BY(sync_mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(sync_mu_) = 0;
  // False after a checkpoint attempt created a generation it could not write the
  // checkpoint of: the next attempt reuses that generation.
  bool rotate_ ABSL_GUARDED_BY(sync_mu_) = true;
  uint64_t taken_seq_ ABSL_GUARDED_BY(sync_mu_) = 0;    // last record taken from the buffer
  uint64_t durable_seq_ ABSL_GUARDED_BY(sync_mu_) = 0;  // every record up to it is durable
  // The last kMaxLostRanges failed writes, so a Sync of one of their records
  // reports the failure even after a later write succeeded. Callers Sync right
  // after appending, so older ones are never asked about.
  static constexpr size_t kMaxLostRanges = 1024;
  std::vector<LostRange> lost_ ABSL_GUARDED_BY(sync_mu_);

  mutable absl::Mutex append_mu_;
  std::string buffer_ ABSL_GUARDED_BY(append_mu_);
  uint64_t appended_seq_ ABSL_GUARDED_BY(append_mu_) = 0;
  uint64_t records_since_checkpoint_ ABSL_GUARDED_BY(append_mu_) = 0;
  absl::Status durability_ ABSL_GUARDED_BY(append_mu_);
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_JOURNAL_H_
