// NVMe completion status in words and as an errno, for logs, absl::Status messages and the
// per-request results (bytes or -errno) of queue_pair.h.
#ifndef TUTTI_DAEMON_IO_NVME_STATUS_TEXT_H_
#define TUTTI_DAEMON_IO_NVME_STATUS_TEXT_H_

#include <cstdint>
#include <string>

namespace tutti::io::nvme {

// "SCT 0 SC 0x80 (LBA Out of Range)"; codes without a name read "(unknown)". `status` is
// SCT << 8 | SC (spec.h CqeStatus).
std::string StatusText(uint16_t status);

// The errno a request failing with `status` reports (positive): LBA out of range, invalid field
// or opcode -> EINVAL; capacity exceeded -> ENOSPC; namespace not ready -> EAGAIN; invalid
// namespace -> ENXIO; access denied -> EACCES; abort requested / SQ deleted -> ECANCELED;
// everything else (internal, data transfer, media errors, unknown) -> EIO. 0 for success.
int StatusToErrno(uint16_t status);

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_STATUS_TEXT_H_
