// The journal's owner thread (journal_writer.h).
#include "daemon/store/journal_writer.h"

#include <pthread.h>

#include <cassert>
#include <utility>

#include "common/log.h"

namespace tutti::store {

JournalWriter::JournalWriter(std::unique_ptr<Journal> journal) : journal_(std::move(journal)) {
  durability_ = journal_->durability();
  records_since_checkpoint_ = journal_->records_since_checkpoint();
  thread_ = std::thread([this] { Loop(); });
  pthread_setname_np(thread_.native_handle(), "tutti-journal");
}

JournalWriter::~JournalWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

uint64_t JournalWriter::Append(JournalRecord r) {
  absl::MutexLock lock(&mu_);
  Message m;
  m.record = std::move(r);
  queue_.push_back(std::move(m));
  return ++queued_seq_;
}

absl::Status JournalWriter::Post(Message m) {
  Done done;
  m.done = &done;
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(m));
  mu_.Await(absl::Condition(&done.done));
  return done.status;
}

absl::Status JournalWriter::Sync(uint64_t seq) { return SyncAndApply(seq, nullptr); }

absl::Status JournalWriter::Sync() {
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    seq = queued_seq_;
  }
  return Sync(seq);
}

absl::Status JournalWriter::SyncAndApply(uint64_t seq, std::function<void()> apply) {
  Message m;
  m.sync_seq = seq;
  m.apply = std::move(apply);
  return Post(std::move(m));
}

absl::Status JournalWriter::Checkpoint(std::function<void(Journal::Emitter&)> snapshot) {
  Message m;
  m.checkpoint = std::move(snapshot);
  return Post(std::move(m));
}

absl::Status JournalWriter::durability() const {
  absl::MutexLock lock(&mu_);
  return durability_;
}

uint64_t JournalWriter::records_since_checkpoint() const {
  absl::MutexLock lock(&mu_);
  return records_since_checkpoint_;
}

void JournalWriter::Loop() {
  for (;;) {
    std::deque<Message> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and every message handled
      batch.swap(queue_);
    }
    Handle(batch);
  }
}

void JournalWriter::Handle(std::deque<Message>& batch) {
  size_t i = 0;
  while (i < batch.size()) {
    std::vector<absl::Status> results;
    size_t end = i;
    if (batch[i].checkpoint) {
      results.push_back(journal_->Checkpoint(batch[i].checkpoint));
      end = i + 1;
    } else {
      // A run of appends and syncs up to the next checkpoint: every append first, then one
      // Journal::Sync per waiter (the first writes and syncs the lot; the others find their
      // records covered, or their write's error), then the applies, in order.
      for (; end < batch.size() && !batch[end].checkpoint; ++end) {
        if (!batch[end].record) continue;
        const uint64_t seq = std::visit([this](const auto& r) { return journal_->Append(r); },
                                        *batch[end].record);
        assert(seq == appended_seq_ + 1);  // the numbers Append handed out are the journal's
        appended_seq_ = seq;
      }
      for (size_t k = i; k < end; ++k) {
        Message& m = batch[k];
        if (m.done == nullptr) continue;
        absl::Status s = journal_->Sync(m.sync_seq);
        if (s.ok() && m.apply) m.apply();
        results.push_back(std::move(s));
      }
    }
    absl::MutexLock lock(&mu_);
    durability_ = journal_->durability();
    records_since_checkpoint_ = journal_->records_since_checkpoint();
    size_t r = 0;
    for (size_t k = i; k < end; ++k) {
      if (batch[k].done == nullptr) continue;
      batch[k].done->status = std::move(results[r++]);
      batch[k].done->done = true;
    }
    i = end;
  }
}

}  // namespace tutti::store
