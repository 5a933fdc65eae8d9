// Owned, zero-filled memory aligned to kAlignment, for O_DIRECT transfers.
//
// Thread-safety: like a std::vector: concurrent reads are safe, writes need external locking.
#ifndef TUTTI_DAEMON_IO_ALIGNED_BUFFER_H_
#define TUTTI_DAEMON_IO_ALIGNED_BUFFER_H_

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/types/span.h"
#include "daemon/io/io_backend.h"

namespace tutti::io {

// Whether to back the buffer with transparent huge pages where the kernel allows (THP "always" or
// "madvise"). Staging for I/O should: a transfer into 4 KiB pages that are not physically
// contiguous reaches the device as several segments, and on a virtio disk that was measured to
// cost 10-25% of random-read throughput at 32 KiB (bench/io_bench.cc, FORMAT.md notes).
enum class HugePages { kNo, kPrefer };

class AlignedBuffer {
 public:
  static constexpr uint64_t kHugePage = 2 << 20;

  AlignedBuffer() = default;
  // `bytes` is rounded up to a multiple of kAlignment (of kHugePage with kPrefer). Aborts if
  // memory is exhausted (like new).
  explicit AlignedBuffer(uint64_t bytes, HugePages huge = HugePages::kNo)
      : size_(RoundUp(bytes, huge == HugePages::kPrefer ? kHugePage : kAlignment)),
        data_(static_cast<uint8_t*>(Allocate(size_, huge))) {
    if (size_ > 0) std::memset(data_.get(), 0, size_);  // after madvise: faults in huge pages
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
  static uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
  static void* Allocate(uint64_t bytes, HugePages huge) {
    if (bytes == 0) return nullptr;
    const bool prefer = huge == HugePages::kPrefer;
    void* p = std::aligned_alloc(prefer ? kHugePage : kAlignment, bytes);
    if (p == nullptr) std::abort();
    if (prefer) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
    return p;
  }

  uint64_t size_ = 0;
  std::unique_ptr<uint8_t, Free> data_;
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_ALIGNED_BUFFER_H_
