#include "daemon/store/events.h"

#include <sys/random.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

namespace tutti::store {
namespace {

// A nonzero random id: getrandom, or (should the kernel refuse) Abseil's seeded generator.
uint64_t RandomId() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    absl::BitGen gen;
    v = absl::Uniform<uint64_t>(gen);
  }
  return v == 0 ? 1 : v;
}

}  // namespace

uint64_t PoolIdOf(const std::array<uint8_t, 16>& uuid) {
  uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id = (id << 8) | uuid[i];
  return id;
}

EventHub::EventHub(const EventHubOptions& options)
    : max_pending_(std::max<uint32_t>(1, options.max_pending_events)),
      max_total_(std::max<uint64_t>(1, options.max_pending_events_total)),
      pool_id_(options.pool_id != 0 ? options.pool_id : RandomId()),
      boot_id_(options.boot_id != 0 ? options.boot_id : RandomId()) {}

uint64_t EventHub::blocks_lost_at_start() const {
  absl::MutexLock lock(&mu_);
  return blocks_lost_;
}

void EventHub::SetBlocksLostAtStart(uint64_t blocks) {
  absl::MutexLock lock(&mu_);
  blocks_lost_ = blocks;
}

void EventHub::DropOldest(NamespaceId ns, Ring& ring) {
  oldest_.erase({ring.events.front().order, ns});
  ring.events.pop_front();
  --kept_;
  if (!ring.events.empty()) oldest_.emplace(ring.events.front().order, ns);
}

void EventHub::Publish(NamespaceId ns, BlockEventKind kind, const Key& key) {
  absl::MutexLock lock(&mu_);
  Ring& ring = rings_[ns];
  if (ring.events.size() >= max_pending_) DropOldest(ns, ring);
  ++published_count_;
  if (ring.events.empty()) oldest_.emplace(published_count_, ns);
  ring.events.push_back(Kept{BlockEvent{++ring.last_seq, kind, key}, published_count_});
  ++kept_;
  while (kept_ > max_total_) {  // never this event: it is the newest, and max_total_ >= 1
    const NamespaceId from = oldest_.begin()->second;
    DropOldest(from, rings_.find(from)->second);
  }
  published_.SignalAll();
}

EventHub::Cursor EventHub::Subscribe(NamespaceId ns, uint64_t after_seq, uint64_t boot_id,
                                     bool* resumed) const {
  absl::MutexLock lock(&mu_);
  uint64_t last = 0, first = 1;  // the ring holds seqs first..last
  if (auto it = rings_.find(ns); it != rings_.end()) {
    last = it->second.last_seq;
    first = last - it->second.events.size() + 1;
  }
  // Every event after after_seq is in the ring: after_seq + 1 >= first (or none is missing).
  *resumed = boot_id == boot_id_ && after_seq <= last && after_seq + 1 >= first;
  return Cursor{ns, *resumed ? after_seq : last};
}

absl::Status EventHub::Next(Cursor* cursor, absl::Time deadline, size_t max_events,
                            std::vector<BlockEvent>* out) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (shut_down_) return absl::UnavailableError("tuttid is shutting down");
    auto it = rings_.find(cursor->ns);
    if (it != rings_.end() && it->second.last_seq > cursor->after_seq) break;
    if (published_.WaitWithDeadline(&mu_, deadline)) return absl::OkStatus();
  }
  const Ring& ring = rings_.find(cursor->ns)->second;
  const uint64_t first = ring.last_seq - ring.events.size() + 1;
  if (cursor->after_seq + 1 < first) {
    // A ring shorter than max_pending_ was cut by the total.
    const std::string kept =
        ring.events.size() < max_pending_
            ? absl::StrCat(max_total_,
                           " for all namespaces together (limits.max_pending_events_total)")
            : absl::StrCat(max_pending_, " (limits.max_pending_events)");
    return absl::ResourceExhaustedError(absl::StrCat(
        "the subscriber is ", ring.last_seq - cursor->after_seq,
        " events behind the namespace's last event; tuttid keeps ", kept, ": the events after seq ",
        cursor->after_seq, " are gone. Watch again (resumed will be false) and resynchronize"));
  }
  const size_t begin = cursor->after_seq + 1 - first;
  const size_t n = std::min(max_events, ring.events.size() - begin);
  for (size_t i = begin; i < begin + n; ++i) out->push_back(ring.events[i].event);
  cursor->after_seq += n;
  return absl::OkStatus();
}

void EventHub::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  published_.SignalAll();
}

uint64_t EventHub::events_kept() const {
  absl::MutexLock lock(&mu_);
  return kept_;
}

uint64_t EventHub::last_seq(NamespaceId ns) const {
  absl::MutexLock lock(&mu_);
  auto it = rings_.find(ns);
  return it == rings_.end() ? 0 : it->second.last_seq;
}

}  // namespace tutti::store
