// Owned, zero-filled memory aligned to kAlignment, for O_DIRECT transfers.
//
// Thread-safety: like a std::vector: concurrent reads are safe, writes need external locking.
#ifndef TUTTI_DAEMON_IO_ALIGNED_BUFFER_H_
#define TUTTI_DAEMON_IO_ALIGNED_BUFFER_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/types/span.h"
#include "daemon/io/io_backend.h"

namespace tutti::io {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `bytes` is rounded up to a multiple of kAlignment. Aborts if memory is exhausted (like new).
  explicit AlignedBuffer(uint64_t bytes)
      : size_((bytes + kAlignment - 1) / kAlignment * kAlignment),
        data_(static_cast<uint8_t*>(Allocate(size_))) {
    if (size_ > 0) std::memset(data_.get(), 0, size_);
  }

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  uint64_t size() const { return size_; }
  absl::Span<uint8_t> span() { return {data_.get(), size_}; }
  absl::Span<const uint8_t> span() const { return {data_.get(), size_}; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  static void* Allocate(uint64_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(kAlignment, bytes);
    if (p == nullptr) std::abort();
    return p;
  }

  uint64_t size_ = 0;
  std::unique_ptr<uint8_t, Free> data_;
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_ALIGNED_BUFFER_H_
