// The requests one queue's owner thread (a pool file's ring, a namespace's ring) has taken and not
// yet issued, in arrival order. The backends are plain per-queue executors: which class goes first
// is the per-device scheduler's policy (daemon/datapath/scheduler.h), not theirs.
//
// One exception, and the only place one queue issues out of arrival order (the other, a tmpfs
// file's reads spread over several rings, UringOptions::memory_read_rings, is between queues): when
// the owner may not issue another read now (a cap on reads in flight: today only the "uring"
// backend's on tmpfs files, UringOptions::memory_read_workers, where depth exceeds the cap), writes
// that arrived after the held reads pass them, so the ring's free slots are not left idle behind
// reads that must wait for their workers. It is not a reads-first policy (it puts writes ahead, the
// reverse), and it is not needed for correctness: the held reads would complete anyway (tmpfs
// copies never block), and the store reads only pinned blocks, whose slots are never overwritten
// while pinned (daemon/store/block_store.h), so a pass changes no read's data. It stays because it
// is the cap's contract, which issue_queue_test asserts (HeldReadsLetLaterWritesPass). With no cap
// (uring_cmd, uring off tmpfs) Pop(true) is plain FIFO.
//
// Thread-safety: none; the queue's owner thread alone uses it.
#ifndef TUTTI_DAEMON_IO_ISSUE_QUEUE_H_
#define TUTTI_DAEMON_IO_ISSUE_QUEUE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "daemon/io/io_backend.h"

namespace tutti::io {

template <typename Item>
class IssueQueue {
 public:
  // Queues `item`, an `op`, after everything queued.
  void Push(Item item, Op op) { Of(op).push_back({back_++, std::move(item)}); }
  // Queues `item` before everything queued (a retry of a request issued before them).
  void PushFront(Item item, Op op) { Of(op).push_front({--front_, std::move(item)}); }

  bool empty() const { return reads_.empty() && writes_.empty(); }
  bool has_writes() const { return !writes_.empty(); }

  // Takes the oldest item that may go now: the oldest of all when `reads_may_go`, else the oldest
  // write. nullopt when there is none.
  std::optional<Item> Pop(bool reads_may_go) {
    const bool read = reads_may_go && !reads_.empty() &&
                      (writes_.empty() || reads_.front().seq < writes_.front().seq);
    std::deque<Entry>& q = read ? reads_ : writes_;
    if (q.empty()) return std::nullopt;
    Item item = std::move(q.front().item);
    q.pop_front();
    return item;
  }

 private:
  struct Entry {
    int64_t seq;  // arrival order across both classes
    Item item;
  };
  std::deque<Entry>& Of(Op op) { return op == Op::kRead ? reads_ : writes_; }

  std::deque<Entry> reads_, writes_;  // each in arrival order
  int64_t front_ = 0, back_ = 0;      // the next PushFront takes --front_, Push takes back_++
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_ISSUE_QUEUE_H_
