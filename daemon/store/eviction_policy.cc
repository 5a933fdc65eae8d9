#include "daemon/store/eviction_policy.h"

#include "daemon/store/lru_policy.h"

namespace tutti::store {

std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(uint32_t capacity) {
  return std::make_unique<LruPolicy>(capacity);  // the choice: the pool's and the DRAM tier's
}

}  // namespace tutti::store
