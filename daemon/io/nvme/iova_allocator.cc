#include "daemon/io/nvme/iova_allocator.h"

#include <cassert>
#include <iterator>

namespace tutti::io::nvme {

IovaAllocator::IovaAllocator(uint64_t begin, uint64_t end, uint64_t alignment)
    : alignment_(alignment) {
  assert(alignment != 0 && (alignment & (alignment - 1)) == 0);
  const uint64_t start = Round(begin);
  const uint64_t stop = end & ~(alignment - 1);
  if (stop > start) free_[start] = stop - start;
}

std::optional<uint64_t> IovaAllocator::Allocate(uint64_t size) {
  const uint64_t need = Round(size == 0 ? 1 : size);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t start = it->first;
    const uint64_t left = it->second - need;
    free_.erase(it);
    if (left > 0) free_[start + need] = left;
    return start;
  }
  return std::nullopt;
}

void IovaAllocator::Free(uint64_t iova, uint64_t size) {
  uint64_t start = iova;
  uint64_t length = Round(size == 0 ? 1 : size);
  auto next = free_.lower_bound(start);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second <= start);  // not freed twice
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && start + length == next->first) {
    length += next->second;
    free_.erase(next);
  }
  free_[start] = length;
}

uint64_t IovaAllocator::free_bytes() const {
  uint64_t total = 0;
  for (const auto& [start, length] : free_) total += length;
  return total;
}

}  // namespace tutti::io::nvme
