// Whole 4 KiB pages: the unit of O_DIRECT I/O and of the pool's object frames.
#ifndef TUTTI_COMMON_ALIGN_H_
#define TUTTI_COMMON_ALIGN_H_

#include <cstdint>

namespace tutti {

inline constexpr uint32_t kPageBytes = 4096;

// `v` rounded up to a multiple of 4096. Precondition: the result fits the type (v <= 2^32 - 4096
// for the 32-bit form).
constexpr uint32_t RoundUp4K(uint32_t v) { return (v + 4095) / 4096 * 4096; }
constexpr uint64_t RoundUp4K(uint64_t v) { return (v + 4095) / 4096 * 4096; }

}  // namespace tutti

#endif  // TUTTI_COMMON_ALIGN_H_
