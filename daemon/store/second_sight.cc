#include "daemon/store/second_sight.h"

#include "absl/hash/hash.h"

namespace tutti::store {

bool SecondSight::Admit(NamespaceId ns, const Key& key) {
  const uint64_t h = absl::HashOf(ns, key.lo(), key.hi());
  absl::MutexLock lock(&mu_);
  if (auto it = ghost_.find(h); it != ghost_.end()) {
    order_.splice(order_.end(), order_, it->second);  // most recently seen now
    return true;
  }
  order_.push_back(h);
  ghost_.emplace(h, std::prev(order_.end()));
  if (ghost_.size() > capacity_) {
    ghost_.erase(order_.front());
    order_.pop_front();
  }
  return false;
}

uint64_t SecondSight::size() const {
  absl::MutexLock lock(&mu_);
  return ghost_.size();
}

}  // namespace tutti::store
