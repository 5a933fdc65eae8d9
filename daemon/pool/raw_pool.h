// The pool on raw NVMe namespaces (no filesystem): pool file i is namespace i, reached through an
// I/O backend whose file i is that whole namespace ("uring_cmd"; later "nvme"). The pool occupies
// bytes [0, layout.file_bytes()) of each namespace, laid out exactly as a pool file (superblock at
// byte 0, then slot headers and frames), so byte offset o is LBA o / lba_size. Nothing is created
// or allocated at run time; creating the pool writes one superblock per namespace. Format and the
// rules for fresh and foreign namespaces: daemon/pool/FORMAT.md ("The pool on raw namespaces").
//
// Thread-safety: OpenOrCreateRawPool is thread-compatible (call it once, at start-up, before the
// store uses the backend).
#ifndef TUTTI_DAEMON_POOL_RAW_POOL_H_
#define TUTTI_DAEMON_POOL_RAW_POOL_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/io/io_backend.h"
#include "daemon/pool/layout.h"

namespace tutti::pool {

// The bytes at the start of a namespace that must read as zeros for it to count as fresh.
inline constexpr uint32_t kRawProbeBytes = 1 << 20;

struct RawPool {
  std::array<uint8_t, 16> uuid{};
  bool created = false;  // true if this call created the pool
  std::string UuidHex() const;
};

// The pool capacity to lay out on namespaces of `namespace_bytes`: the smaller of `configured`
// (pool.capacity_bytes) and the number of namespaces times the smallest one, so every pool file
// fits in its namespace.
uint64_t RawPoolCapacity(uint64_t configured, absl::Span<const uint64_t> namespace_bytes);

// What the first bytes of a namespace hold, when not a tutti pool: the name of a recognised
// signature ("an ext2/3/4 filesystem", "a GPT partition table", ...), "data (first non-zero byte
// at offset N)" for other non-zero bytes, or "" when all `len` bytes are zero (fresh).
std::string ForeignContents(const uint8_t* p, size_t len);

// Opens the pool on the namespaces of `io` (`devices[i]` names namespace i in messages), creating
// it if every namespace is fresh (its first kRawProbeBytes read as zeros). `layout` must have
// io->num_files() files. Creation writes the superblocks, last namespace first, each made durable
// (io->Sync) before the next; namespace 0's superblock completes it.
// Errors:
//  - INVALID_ARGUMENT: layout and backend disagree on the number of namespaces.
//  - FAILED_PRECONDITION: a namespace smaller than layout.file_bytes(); a namespace holding
//    something else (a filesystem or partition signature, other data: it is never overwritten); a
//    superblock of another layout, another file index, or another pool's uuid than namespace 0's;
//    some namespaces fresh and others holding a pool (the message names both and what to do).
//  - DATA_LOSS: a superblock with the pool magic but a bad checksum.
//  - UNAVAILABLE: reading or writing a namespace failed (with the errno text).
// `devices_field`: the config field that lists them, named in messages.
absl::StatusOr<RawPool> OpenOrCreateRawPool(
    io::IoBackend* io, const std::vector<std::string>& devices, const PoolLayout& layout,
    const std::string& devices_field = "io.passthrough_devices");

}  // namespace tutti::pool

#endif  // TUTTI_DAEMON_POOL_RAW_POOL_H_
