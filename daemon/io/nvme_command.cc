#include "daemon/io/nvme_command.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tutti::io::nvme_cmd {
namespace {

uint64_t Le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Identify Namespace fields (figure 280 of NVMe 2.0 base, common to NVM command set).
constexpr size_t kNsze = 0, kNlbaf = 25, kFlbas = 26, kLbaf0 = 128;
// Identify Controller fields.
constexpr size_t kMdts = 77, kVwc = 525;

const char* SctName(uint8_t sct) {
  switch (sct) {
    case 0: return "generic";
    case 1: return "command specific";
    case 2: return "media and data integrity";
    case 3: return "path related";
    default: return "vendor or reserved";
  }
}

const char* ScName(uint8_t sct, uint8_t sc) {
  if (sct == 0) {
    switch (sc) {
      case 0x00: return "success";
      case 0x01: return "invalid command opcode";
      case 0x02: return "invalid field in command";
      case 0x04: return "data transfer error";
      case 0x06: return "internal error";
      case 0x07: return "command abort requested";
      case 0x0b: return "invalid namespace or format";
      case 0x80: return "LBA out of range";
      case 0x81: return "capacity exceeded";
      case 0x82: return "namespace not ready";
      default: return "other";
    }
  }
  if (sct == 2) {
    switch (sc) {
      case 0x80: return "write fault";
      case 0x81: return "unrecovered read error";
      case 0x86: return "access denied";
      case 0x87: return "deallocated or unwritten logical block";
      default: return "other";
    }
  }
  return "other";
}

}  // namespace

absl::StatusOr<Geometry> ParseIdentify(const uint8_t* ns, const uint8_t* ctrl, uint32_t nsid,
                                       uint32_t max_transfer_cap, const std::string& device) {
  Geometry g;
  g.nsid = nsid;
  g.lbas = Le64(ns + kNsze);
  if (g.lbas == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        device, ": namespace ", nsid, " has size 0 (inactive namespace?); attach one or fix "
        "io.passthrough_devices"));
  }
  const uint8_t flbas = ns[kFlbas];
  // Format index: bits 3:0, and bits 6:5 as its high bits when more than 16 formats exist.
  uint32_t format = flbas & 0x0f;
  if (ns[kNlbaf] >= 16) format |= ((flbas >> 5) & 0x3u) << 4;
  const uint32_t lbaf = Le32(ns + kLbaf0 + 4 * format);
  const uint32_t metadata = lbaf & 0xffff;
  const uint32_t lbads = (lbaf >> 16) & 0xff;
  if (metadata != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        device, ": LBA format ", format, " carries ", metadata, " bytes of metadata per LBA; "
        "tuttid needs a format without metadata (nvme format --lbaf=N)"));
  }
  if (lbads < 9 || lbads > 12) {
    return absl::FailedPreconditionError(absl::StrCat(
        device, ": LBA size 2^", lbads, " bytes; tuttid needs 512 to 4096 (nvme format --lbaf=N)"));
  }
  g.lba_bytes = 1u << lbads;
  g.volatile_write_cache = (ctrl[kVwc] & 0x1) != 0;
  uint64_t max = max_transfer_cap;
  if (ctrl[kMdts] != 0 && ctrl[kMdts] < 32) max = std::min<uint64_t>(max, 4096ull << ctrl[kMdts]);
  max = std::min<uint64_t>(max, uint64_t{kMaxLbasPerCommand} * g.lba_bytes);
  g.max_transfer_bytes = static_cast<uint32_t>(max / 4096 * 4096);
  return g;
}

bool ToLbaRange(const Geometry& g, uint64_t offset, uint32_t len, uint64_t limit_bytes,
                LbaRange* out) {
  if (g.lba_bytes == 0 || len == 0) return false;
  if (offset % g.lba_bytes != 0 || len % g.lba_bytes != 0) return false;
  if (offset > limit_bytes || len > limit_bytes - offset) return false;
  const uint64_t count = len / g.lba_bytes;
  if (count > kMaxLbasPerCommand) return false;
  out->slba = offset / g.lba_bytes;
  out->count = static_cast<uint32_t>(count);
  return true;
}

nvme_uring_cmd MakeIoCommand(uint8_t opcode, uint32_t nsid, LbaRange range, void* buf,
                             uint32_t len) {
  nvme_uring_cmd c;
  std::memset(&c, 0, sizeof(c));
  c.opcode = opcode;
  c.nsid = nsid;
  c.addr = reinterpret_cast<uintptr_t>(buf);
  c.data_len = len;
  c.cdw10 = static_cast<uint32_t>(range.slba);
  c.cdw11 = static_cast<uint32_t>(range.slba >> 32);
  c.cdw12 = range.count - 1;  // NLB is 0-based
  return c;
}

nvme_passthru_cmd MakeIdentify(uint32_t cns, uint32_t nsid, void* buf) {
  nvme_passthru_cmd c;
  std::memset(&c, 0, sizeof(c));
  c.opcode = kAdminIdentify;
  c.nsid = nsid;
  c.addr = reinterpret_cast<uintptr_t>(buf);
  c.data_len = kIdentifyBytes;
  c.cdw10 = cns;
  return c;
}

nvme_passthru_cmd MakeFlush(uint32_t nsid) {
  nvme_passthru_cmd c;
  std::memset(&c, 0, sizeof(c));
  c.opcode = kOpFlush;
  c.nsid = nsid;
  return c;
}

Status DecodeStatus(uint16_t status) {
  Status s;
  s.sc = status & 0xff;
  s.sct = (status >> 8) & 0x7;
  s.more = (status >> 13) & 1;
  s.dnr = (status >> 14) & 1;
  return s;
}

int StatusToErrno(uint16_t status) {
  const Status s = DecodeStatus(status);
  if (s.sct == 0) {
    switch (s.sc) {
      case 0x01: return -EOPNOTSUPP;
      case 0x02: return -EINVAL;
      case 0x80: return -ERANGE;
      case 0x81: return -ENOSPC;
      default: break;
    }
  }
  if (s.sct == 2 && s.sc == 0x86) return -EACCES;
  return -EIO;
}

std::string StatusText(uint16_t status) {
  const Status s = DecodeStatus(status);
  return absl::StrFormat("NVMe status 0x%04x (SCT 0x%x %s, SC 0x%02x %s%s%s)", status, s.sct,
                         SctName(s.sct), s.sc, ScName(s.sct, s.sc), s.dnr ? ", DNR" : "",
                         s.more ? ", more" : "");
}

}  // namespace tutti::io::nvme_cmd
