// Helpers for tutti's fuzz targets: re-sealing inputs whose checksums a mutation broke, so the
// fuzzer reaches the decoding behind each checksum, and a scratch directory per process.
// Formats: daemon/store/JOURNAL.md, daemon/pool/FORMAT.md (this code repeats their checksum rules
// on purpose: a change there breaks the seeds, and make_seeds regenerates them).
//
// Thread-safety: none needed (fuzz targets are single-threaded).
#ifndef TUTTI_TESTS_FUZZ_FUZZ_UTIL_H_
#define TUTTI_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace tutti::fuzz {

// Reframes `data` as journal records (u32 length, u32 type, payload, u64 checksum), each with its
// checksum recomputed; a length past the end is cut to what remains (the last record keeps its
// claimed length, so torn tails stay reachable). Bytes after the last whole record are kept raw.
std::string SealJournalRecords(const uint8_t* data, size_t size);

// `page` (kSlotHeaderBytes) with its slot-header checksum recomputed.
void SealSlotHeader(uint8_t* page);

// `page` (4096 bytes) with its superblock checksum recomputed.
void SealSuperblock(uint8_t* page);

// A directory of this process's own, created once (under $TEST_TMPDIR, else /tmp); lives until
// the process exits.
const std::string& ScratchDir();

// Removes every file in `dir` (not recursive).
void ClearDir(const std::string& dir);

// Writes `bytes` to `path`, replacing it. Aborts on failure (the harness is broken, not the code
// under test).
void WriteFileOrDie(const std::string& path, const std::string& bytes);

}  // namespace tutti::fuzz

#endif  // TUTTI_TESTS_FUZZ_FUZZ_UTIL_H_
