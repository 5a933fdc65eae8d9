// Private to daemon/store: the journal's one owner. A thread of its own (tutti-journal) holds the
// store's Journal and is the only thread that appends to it, syncs it or checkpoints it; every
// other thread of the store (the write pipeline's writer and committer, Evict, namespace changes,
// failed reads) hands it records by message and, where it must know they are durable before
// going on, waits for the sync that covers them.
//
// Messages are handled in the order they were queued. The thread appends the records of a run of
// messages and syncs once for all of them that want it (group commit), then completes their
// waiters; a checkpoint is a message of its own, so it falls between two records only where they
// were queued on either side of it. Hence SyncAndApply: its `apply` runs on this thread right
// after the sync, before any later message, so a checkpoint sees a namespace record's effect
// exactly when it does not drop the record.
//
// Thread-safety: thread-safe. Append never waits (it may be called under the store's locks: its
// own lock is a leaf); Sync, SyncAndApply and Checkpoint wait for this thread, so their callers
// hold no lock that a checkpoint's `snapshot` or an `apply` takes.
#ifndef TUTTI_DAEMON_STORE_JOURNAL_WRITER_H_
#define TUTTI_DAEMON_STORE_JOURNAL_WRITER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <variant>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/store/journal.h"

namespace tutti::store {

using JournalRecord = std::variant<PutRecord, DeleteRecord, NamespaceRecord, NamespaceDropRecord>;

class JournalWriter {
 public:
  // Takes `journal` (just opened: nothing appended yet, so the sequence numbers Append returns
  // are the journal's) and starts the thread.
  explicit JournalWriter(std::unique_ptr<Journal> journal);
  // Handles every message queued, then stops the thread and closes the journal: records not
  // covered by a Sync are dropped (Journal's destructor).
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;

  // Queues `r` after every record queued before it and returns its sequence number (1, 2, ...),
  // to pass to Sync. Not durable until a Sync covers it.
  uint64_t Append(JournalRecord r);

  // Waits until records up to `seq` are durable (Journal::Sync's contract: OK, or the error of
  // the write that held `seq`; FAILED_PRECONDITION once durability is lost).
  [[nodiscard]] absl::Status Sync(uint64_t seq);
  // Sync of every record queued so far.
  [[nodiscard]] absl::Status Sync();
  // Sync(seq), and when it is OK, `apply` runs on the journal thread before any later message
  // (so before any later checkpoint). Returns the sync's status.
  [[nodiscard]] absl::Status SyncAndApply(uint64_t seq, std::function<void()> apply);
  // Journal::Checkpoint(snapshot) on the journal thread, after every message queued before it.
  [[nodiscard]] absl::Status Checkpoint(std::function<void(Journal::Emitter&)> snapshot);

  // Journal::durability() and records_since_checkpoint() as of the last message handled.
  absl::Status durability() const;
  uint64_t records_since_checkpoint() const;

 private:
  // A waiter's result, completed under mu_.
  struct Done {
    bool done = false;
    absl::Status status;
  };
  struct Message {
    std::optional<JournalRecord> record;  // an Append
    uint64_t sync_seq = 0;                  // a Sync up to this (0: none)
    std::function<void()> apply;            // run after an OK sync
    std::function<void(Journal::Emitter&)> checkpoint;  // a Checkpoint
    Done* done = nullptr;                   // the waiter, completed with the status
  };
  absl::Status Post(Message m);
  void Loop();
  // Handles `batch` in order: runs of appends and syncs with one Journal::Sync each, and the
  // checkpoints between them.
  void Handle(std::deque<Message>& batch);

  const std::unique_ptr<Journal> journal_;  // the journal thread's alone
  uint64_t appended_seq_ = 0;                 // the journal thread's: last record appended
  mutable absl::Mutex mu_;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_seq_ ABSL_GUARDED_BY(mu_) = 0;  // sequence number of the last record queued
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status durability_ ABSL_GUARDED_BY(mu_);
  uint64_t records_since_checkpoint_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_JOURNAL_WRITER_H_
