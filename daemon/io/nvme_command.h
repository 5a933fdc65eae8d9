// Internal to daemon/io: the NVMe side of the "uring_cmd" backend, as pure functions with no system
// calls: Identify data parsed into a namespace's geometry, byte ranges mapped onto LBAs, the I/O
// commands built, and completion statuses decoded. Unit-tested without a device
// (nvme_command_test.cc); references are to the NVMe Base Specification 2.0.
//
// Thread-safety: thread-safe (no state).
#ifndef TUTTI_DAEMON_IO_NVME_COMMAND_H_
#define TUTTI_DAEMON_IO_NVME_COMMAND_H_

#include <linux/nvme_ioctl.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tutti::io::nvme_cmd {

inline constexpr uint32_t kIdentifyBytes = 4096;
inline constexpr uint8_t kOpFlush = 0x00;
inline constexpr uint8_t kOpWrite = 0x01;
inline constexpr uint8_t kOpRead = 0x02;
inline constexpr uint8_t kAdminIdentify = 0x06;
inline constexpr uint32_t kCnsNamespace = 0x00;
inline constexpr uint32_t kCnsController = 0x01;
// One command moves at most this many LBAs (CDW12 NLB is 16 bits, 0-based).
inline constexpr uint32_t kMaxLbasPerCommand = 65536;

// What the backend needs to know about one namespace.
struct Geometry {
  uint32_t nsid = 0;
  uint32_t lba_bytes = 0;                 // a power of two in [512, 4096]
  uint64_t lbas = 0;                      // namespace size (NSZE)
  bool volatile_write_cache = false;      // Identify Controller VWC bit 0: Sync sends Flush
  uint32_t max_transfer_bytes = 0;        // per command: MDTS, the caller's cap, 65536 LBAs
  uint64_t bytes() const { return lbas * lba_bytes; }
};

// Parses Identify Namespace (CNS 0, `ns`) and Identify Controller (CNS 1, `ctrl`) data, 4096 bytes
// each, of namespace `nsid` of `device` (named in messages). `max_transfer_cap` bounds the bytes of
// one command (a multiple of 4096); MDTS is read in units of 4 KiB (CAP.MPSMIN is not visible
// through the kernel's interface; 4 KiB is the smallest page every controller supports).
// FAILED_PRECONDITION, naming the device and what to do, for a namespace of size 0, an LBA format
// with metadata, or an LBA size that is not a power of two in [512, 4096] (pool I/O is in 4 KiB
// units).
absl::StatusOr<Geometry> ParseIdentify(const uint8_t* ns, const uint8_t* ctrl, uint32_t nsid,
                                       uint32_t max_transfer_cap, const std::string& device);

struct LbaRange {
  uint64_t slba = 0;
  uint32_t count = 0;  // LBAs, >= 1
};

// The LBAs of bytes [offset, offset + len) of the namespace. False unless offset and len are
// multiples of the LBA size, len > 0, the count is at most kMaxLbasPerCommand, and the range ends
// at or before `limit_bytes` (the namespace size, or more in tests that want the controller's own
// range check).
bool ToLbaRange(const Geometry& g, uint64_t offset, uint32_t len, uint64_t limit_bytes,
                LbaRange* out);

// A Read or Write (`opcode`) of `range` to or from `buf` (`len` bytes), for NVME_URING_CMD_IO.
nvme_uring_cmd MakeIoCommand(uint8_t opcode, uint32_t nsid, LbaRange range, void* buf,
                             uint32_t len);
// Identify of `cns` (kCnsNamespace with `nsid`, kCnsController with 0) into `buf` (4096 bytes).
nvme_passthru_cmd MakeIdentify(uint32_t cns, uint32_t nsid, void* buf);
nvme_passthru_cmd MakeFlush(uint32_t nsid);

// A completion status as the kernel hands it back (the CQE's status field without the phase bit:
// SC bits 0-7, SCT bits 8-10, CRD 11-12, More 13, DNR 14); 0 is success.
struct Status {
  uint8_t sct = 0;
  uint8_t sc = 0;
  bool more = false;
  bool dnr = false;  // do not retry
};
Status DecodeStatus(uint16_t status);
// The negative errno a request completes with: -ERANGE for an LBA out of range, -ENOSPC for
// capacity exceeded, -EINVAL for an invalid field, -EOPNOTSUPP for an invalid opcode, -EACCES for
// access denied, -EIO otherwise (media and data errors included).
int StatusToErrno(uint16_t status);
// "NVMe status 0x4080 (SCT 0x0 generic, SC 0x80 LBA out of range, DNR)".
std::string StatusText(uint16_t status);

}  // namespace tutti::io::nvme_cmd

#endif  // TUTTI_DAEMON_IO_NVME_COMMAND_H_
