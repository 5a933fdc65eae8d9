// Internal to daemon/pool: the pool superblock (the first 4 KiB of every pool file or raw
// namespace), its codec and the comparisons both openers make. Format: daemon/pool/FORMAT.md.
//
// Thread-safety: plain functions over caller-owned memory; thread-safe.
#ifndef TUTTI_DAEMON_POOL_SUPERBLOCK_H_
#define TUTTI_DAEMON_POOL_SUPERBLOCK_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/pool/layout.h"

namespace tutti::pool {

inline constexpr uint32_t kFormatVersion = 2;

struct Superblock {
  uint32_t version = kFormatVersion;
  uint32_t file_index = 0, num_files = 0, object_bytes = 0, max_objects = 0, extent_slots = 0;
  uint64_t num_slots = 0, file_bytes = 0;
  std::array<uint8_t, 16> uuid{};
  uint64_t created_unix = 0;  // informational
};

// The uuid as 32 lowercase hex digits.
std::string Hex(const std::array<uint8_t, 16>& uuid);

// A random RFC 4122 version-4 uuid. INTERNAL if getrandom fails.
absl::StatusOr<std::array<uint8_t, 16>> NewUuid();

// The superblock of file `index` of a pool of `layout`, created now.
Superblock FromLayout(const PoolLayout& layout, uint32_t index, const std::array<uint8_t, 16>& uuid);

// Writes `sb` into the kSuperblockBytes at `p` (checksum included).
void EncodeSuperblock(const Superblock& sb, uint8_t* p);

// True when the kSuperblockBytes at `p` start with the pool magic ("TUTTIPOL").
bool HasPoolMagic(const uint8_t* p);

// Decodes the kSuperblockBytes at `p`, read from `path` (named in messages). FAILED_PRECONDITION
// for a bad magic or another format version (format 1 says how to start over); DATA_LOSS for a
// checksum mismatch.
absl::StatusOr<Superblock> DecodeSuperblock(const uint8_t* p, const std::string& path);

// "field: pool X, configuration Y" for each layout field that differs; empty if none does.
std::string LayoutDifferences(const Superblock& have, const Superblock& want);

}  // namespace tutti::pool

#endif  // TUTTI_DAEMON_POOL_SUPERBLOCK_H_
