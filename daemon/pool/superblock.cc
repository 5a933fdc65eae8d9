#include "daemon/pool/superblock.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/pool/endian.h"
#include "xxhash.h"

namespace tutti::pool {
namespace {

using internal::Get32;
using internal::Get64;
using internal::Put32;
using internal::Put64;

constexpr char kMagic[8] = {'T', 'U', 'T', 'T', 'I', 'P', 'O', 'L'};
constexpr uint32_t kPerSlotFormatVersion = 1;  // before extents: refused, see FORMAT.md
constexpr size_t kChecksumAt = kSuperblockBytes - 8;

}  // namespace

std::string Hex(const std::array<uint8_t, 16>& uuid) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : uuid) s += {kDigits[b >> 4], kDigits[b & 15]};
  return s;
}

Superblock FromLayout(const PoolLayout& l, uint32_t index, const std::array<uint8_t, 16>& uuid) {
  Superblock sb;
  sb.file_index = index;
  sb.num_files = l.num_files();
  sb.object_bytes = l.object_bytes();
  sb.max_objects = l.max_objects();
  sb.extent_slots = l.extent_slots();
  sb.num_slots = l.num_slots();
  sb.file_bytes = l.file_bytes();
  sb.uuid = uuid;
  sb.created_unix = static_cast<uint64_t>(std::time(nullptr));
  return sb;
}

void EncodeSuperblock(const Superblock& sb, uint8_t* p) {
  std::memset(p, 0, kSuperblockBytes);
  std::memcpy(p, kMagic, 8);
  Put32(p + 8, sb.version);
  Put32(p + 12, sb.file_index);
  Put32(p + 16, sb.num_files);
  Put32(p + 20, sb.object_bytes);
  Put32(p + 24, sb.max_objects);
  Put32(p + 28, sb.extent_slots);
  Put64(p + 32, sb.num_slots);
  Put64(p + 40, sb.file_bytes);
  std::memcpy(p + 48, sb.uuid.data(), 16);
  Put64(p + 64, sb.created_unix);
  Put64(p + kChecksumAt, XXH3_64bits(p, kChecksumAt));
}

bool HasPoolMagic(const uint8_t* p) { return std::memcmp(p, kMagic, 8) == 0; }

absl::StatusOr<Superblock> DecodeSuperblock(const uint8_t* p, const std::string& path) {
  if (std::memcmp(p, kMagic, 8) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a tutti pool file (bad magic); move it away or fix pool.dirs"));
  }
  if (Get64(p + kChecksumAt) != XXH3_64bits(p, kChecksumAt)) {
    return absl::DataLossError(
        absl::StrCat("superblock of ", path,
                     " is corrupt (checksum mismatch); move the pool files away to "
                     "start an empty pool"));
  }
  Superblock sb;
  sb.version = Get32(p + 8);
  if (sb.version == kPerSlotFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is a pool of format version 1 (the per-slot layout); this tuttid reads only format ",
        kFormatVersion,
        " (extents) and does not convert pools. Stop tuttid, move the pool files (tutti.pool in "
        "every pool.dirs directory) and the journal and checkpoint files of the state directory "
        "(journal.*, checkpoint) away, or delete them, then restart: tuttid creates a version-2 "
        "pool. The old pool's cached blocks are lost; they are a cache"));
  }
  if (sb.version != kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " has pool format version ", sb.version, "; this tuttid reads version ",
                     kFormatVersion, ": run a matching tuttid, or move the pool files away"));
  }
  sb.file_index = Get32(p + 12);
  sb.num_files = Get32(p + 16);
  sb.object_bytes = Get32(p + 20);
  sb.max_objects = Get32(p + 24);
  sb.extent_slots = Get32(p + 28);
  sb.num_slots = Get64(p + 32);
  sb.file_bytes = Get64(p + 40);
  std::memcpy(sb.uuid.data(), p + 48, 16);
  sb.created_unix = Get64(p + 64);
  return sb;
}

std::string LayoutDifferences(const Superblock& have, const Superblock& want) {
  std::vector<std::string> diffs;
  auto cmp = [&](const char* field, uint64_t h, uint64_t w) {
    if (h != w) diffs.push_back(absl::StrCat(field, ": pool ", h, ", configuration ", w));
  };
  cmp("files", have.num_files, want.num_files);
  cmp("object_bytes", have.object_bytes, want.object_bytes);
  cmp("max_objects", have.max_objects, want.max_objects);
  cmp("extent_slots", have.extent_slots, want.extent_slots);
  cmp("slots", have.num_slots, want.num_slots);
  cmp("file_bytes", have.file_bytes, want.file_bytes);
  return absl::StrJoin(diffs, "; ");
}

absl::StatusOr<std::array<uint8_t, 16>> NewUuid() {
  std::array<uint8_t, 16> uuid;
  if (getrandom(uuid.data(), uuid.size(), 0) != static_cast<ssize_t>(uuid.size())) {
    return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
  }
  uuid[6] = (uuid[6] & 0x0F) | 0x40;  // RFC 4122 version 4
  uuid[8] = (uuid[8] & 0x3F) | 0x80;
  return uuid;
}

}  // namespace tutti::pool
