// A queue of items from several streams (a stream: one Retrieve's reads), served in turn: Pop
// takes the oldest item of the stream whose turn it is, then that stream goes to the back of the
// turns. So a stream that queued a thousand items delays one that queues later by at most one
// item per stream ahead of it, instead of by all thousand; within a stream items keep their order.
// With one stream it is a FIFO.
//
// By cost (a quantum > 0, deficit round robin): each item has a cost (its bytes) and a turn is
// worth `quantum` of cost, so streams get equal cost, not equal items: a stream of items half
// the size of another's takes two per turn. A stream keeps its turn while what its turn is worth
// (with what it left from earlier turns) exceeds what it took; it always takes at least one item
// when its turn comes, and an item that costs more than it had is paid off from its next turns
// (a stream in debt passes its turns until it is not).
//
// A stream with nothing queued holds no turn (nor credit or debt): when it queues again it joins
// at the back.
//
// Thread-safety: none (the owner's lock guards it). Streams are few (Retrieves in flight at once),
// so they are found by a walk over the turns.
#ifndef TUTTI_DAEMON_DATAPATH_FAIR_QUEUE_H_
#define TUTTI_DAEMON_DATAPATH_FAIR_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <utility>

namespace tutti::datapath {

template <typename T>
class FairQueue {
 public:
  // quantum 0: a turn is one item (costs ignored).
  explicit FairQueue(uint64_t quantum = 0) : quantum_(static_cast<int64_t>(quantum)) {}

  // Queues `item` behind the items `stream` queued before it.
  void Push(uint64_t stream, T item, uint64_t cost = 1) {
    ++size_;
    for (Stream& s : turns_) {
      if (s.id == stream) {
        s.items.emplace_back(std::move(item), static_cast<int64_t>(cost));
        return;
      }
    }
    turns_.push_back(Stream{stream, {}});
    turns_.back().items.emplace_back(std::move(item), static_cast<int64_t>(cost));
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // Streams with items queued.
  size_t streams() const { return turns_.size(); }

  // The item Pop would return, left queued. Precondition: !empty().
  T& Front() {
    Settle();
    return turns_.front().items.front().first;
  }

  // The oldest item of the stream whose turn it is. Precondition: !empty().
  T Pop() {
    Settle();
    --size_;
    Stream& s = turns_.front();
    T item = std::move(s.items.front().first);
    s.credit -= s.items.front().second;
    s.items.pop_front();
    if (s.items.empty()) {
      turns_.pop_front();
    } else if (quantum_ == 0 || s.credit <= 0) {
      s.turn_started = false;
      turns_.splice(turns_.end(), turns_, turns_.begin());  // its next item waits its turn
    }
    return item;
  }

 private:
  struct Stream {
    uint64_t id;
    std::deque<std::pair<T, int64_t>> items;  // with their costs
    int64_t credit = 0;         // by cost: what its turns were worth less what it took
    bool turn_started = false;  // its current turn's quantum is in `credit`
  };
  // Brings to the front the stream whose turn it is: by cost, streams in debt pass their turns
  // (each one credited as it passes) until one is not.
  void Settle() {
    if (quantum_ == 0) return;
    for (;;) {
      Stream& s = turns_.front();
      if (s.turn_started) return;
      s.turn_started = true;
      s.credit += quantum_;
      if (s.credit > 0) return;
      s.turn_started = false;
      turns_.splice(turns_.end(), turns_, turns_.begin());
    }
  }

  int64_t quantum_;
  std::list<Stream> turns_;  // streams with items, whose turn first at the front
  size_t size_ = 0;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_FAIR_QUEUE_H_
