// A queue of items from several streams (a stream: one Retrieve's reads), served in turn: Pop
// takes the oldest item of the stream whose turn it is, then that stream goes to the back of the
// turns. So a stream that queued a thousand items delays one that queues later by at most one
// item per stream ahead of it, instead of by all thousand; within a stream items keep their order.
// With one stream it is a FIFO.
//
// A stream with nothing queued holds no turn: when it queues again it joins at the back.
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
  // Queues `item` behind the items `stream` queued before it.
  void Push(uint64_t stream, T item) {
    ++size_;
    for (Stream& s : turns_) {
      if (s.id == stream) {
        s.items.push_back(std::move(item));
        return;
      }
    }
    turns_.push_back(Stream{stream, {}});
    turns_.back().items.push_back(std::move(item));
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // Streams with items queued.
  size_t streams() const { return turns_.size(); }

  // The item Pop would return, left queued. Precondition: !empty().
  T& Front() { return turns_.front().items.front(); }

  // The oldest item of the stream whose turn it is. Precondition: !empty().
  T Pop() {
    --size_;
    Stream& s = turns_.front();
    T item = std::move(s.items.front());
    s.items.pop_front();
    if (s.items.empty()) {
      turns_.pop_front();
    } else {
      turns_.splice(turns_.end(), turns_, turns_.begin());  // its next item waits its turn
    }
    return item;
  }

 private:
  struct Stream {
    uint64_t id;
    std::deque<T> items;
  };
  std::list<Stream> turns_;  // streams with items, whose turn first at the front
  size_t size_ = 0;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_FAIR_QUEUE_H_
