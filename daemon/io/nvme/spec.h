// NVMe structures and constants tuttid's driver uses, from the NVM Express Base Specification
// (2.0, with section numbers of 1.4 where they differ) and the NVM Command Set Specification.
// Only what the driver and the controller model need; written from the specification's tables.
//
// This header is plain C++ with no library includes, so nvcc can compile it for the GPU
// (GPU-initiated submission shares the queue code in queue.h). TUTTI_HD marks functions usable
// on host and device.
#ifndef TUTTI_DAEMON_IO_NVME_SPEC_H_
#define TUTTI_DAEMON_IO_NVME_SPEC_H_

#include <stdint.h>

#if defined(__CUDACC__)
#define TUTTI_HD __host__ __device__
#else
#define TUTTI_HD
#endif

namespace tutti::io::nvme {

// ---- Controller registers (BAR0), base spec 3.1 ------------------------------------------------
inline constexpr uint32_t kRegCap = 0x00;   // 64-bit Controller Capabilities
inline constexpr uint32_t kRegVs = 0x08;    // Version
inline constexpr uint32_t kRegCc = 0x14;    // Controller Configuration
inline constexpr uint32_t kRegCsts = 0x1c;  // Controller Status
inline constexpr uint32_t kRegAqa = 0x24;   // Admin Queue Attributes
inline constexpr uint32_t kRegAsq = 0x28;   // 64-bit Admin SQ base address
inline constexpr uint32_t kRegAcq = 0x30;   // 64-bit Admin CQ base address
inline constexpr uint32_t kRegDoorbells = 0x1000;

// CAP fields.
TUTTI_HD inline uint32_t CapMqes(uint64_t cap) { return (cap & 0xffff) + 1; }  // max entries
TUTTI_HD inline uint32_t CapTimeoutMs(uint64_t cap) { return ((cap >> 24) & 0xff) * 500; }
TUTTI_HD inline uint32_t CapDstrd(uint64_t cap) { return (cap >> 32) & 0xf; }
TUTTI_HD inline bool CapNvmCommandSet(uint64_t cap) { return (cap >> 37) & 1; }
TUTTI_HD inline uint32_t CapMpsMinShift(uint64_t cap) { return 12 + ((cap >> 48) & 0xf); }
TUTTI_HD inline uint32_t CapMpsMaxShift(uint64_t cap) { return 12 + ((cap >> 52) & 0xf); }

// CC fields.
inline constexpr uint32_t kCcEnable = 1u << 0;
inline constexpr uint32_t kCcShnShift = 14;  // 2 bits: 01 normal, 10 abrupt shutdown
inline constexpr uint32_t kCcShnNormal = 1u << kCcShnShift;
inline constexpr uint32_t kCcShnMask = 3u << kCcShnShift;
TUTTI_HD inline uint32_t CcMps(uint32_t page_shift) { return (page_shift - 12) << 7; }
TUTTI_HD inline uint32_t CcIoQueueEntrySizes(uint32_t sqes_log2, uint32_t cqes_log2) {
  return (sqes_log2 << 16) | (cqes_log2 << 20);
}

// CSTS fields.
inline constexpr uint32_t kCstsReady = 1u << 0;
inline constexpr uint32_t kCstsFatal = 1u << 1;  // CFS: controller fatal status
inline constexpr uint32_t kCstsShstShift = 2;    // 2 bits: 00 normal, 01 occurring, 10 complete
inline constexpr uint32_t kCstsShstMask = 3u << kCstsShstShift;
inline constexpr uint32_t kCstsShstComplete = 2u << kCstsShstShift;
inline constexpr uint32_t kCstsShstOccurring = 1u << kCstsShstShift;

// AQA: both sizes 0-based, 12 bits each.
TUTTI_HD inline uint32_t Aqa(uint32_t sq_entries, uint32_t cq_entries) {
  return (sq_entries - 1) | ((cq_entries - 1) << 16);
}

// Doorbells (3.1.24/25): queue y's SQ tail at 0x1000 + (2y) * (4 << DSTRD), its CQ head at
// 0x1000 + (2y + 1) * (4 << DSTRD). Queue 0 is the admin queue.
TUTTI_HD inline uint32_t SqTailDoorbell(uint32_t qid, uint32_t dstrd) {
  return kRegDoorbells + (2 * qid) * (4u << dstrd);
}
TUTTI_HD inline uint32_t CqHeadDoorbell(uint32_t qid, uint32_t dstrd) {
  return kRegDoorbells + (2 * qid + 1) * (4u << dstrd);
}

// ---- Queue entries -----------------------------------------------------------------------------
// Submission queue entry (base spec 4.2), 64 bytes. CDW0: opcode [7:0], FUSE [9:8], PSDT [15:14]
// (00 PRPs, 01 SGL data, metadata contiguous), CID [31:16].
struct Sqe {
  uint32_t cdw0;
  uint32_t nsid;
  uint32_t cdw2;
  uint32_t cdw3;
  uint64_t mptr;
  uint64_t dptr[2];  // PRP1, PRP2 -- or one 16-byte SGL descriptor (SGL1)
  uint32_t cdw10;
  uint32_t cdw11;
  uint32_t cdw12;
  uint32_t cdw13;
  uint32_t cdw14;
  uint32_t cdw15;
};
static_assert(sizeof(Sqe) == 64, "SQE is 64 bytes");
inline constexpr uint32_t kSqeSizeLog2 = 6;

inline constexpr uint32_t kPsdtPrp = 0u << 14;
inline constexpr uint32_t kPsdtSgl = 1u << 14;
TUTTI_HD inline uint32_t Cdw0(uint8_t opcode, uint16_t cid, uint32_t psdt) {
  return opcode | psdt | (static_cast<uint32_t>(cid) << 16);
}
TUTTI_HD inline uint8_t SqeOpcode(const Sqe& e) { return e.cdw0 & 0xff; }
TUTTI_HD inline uint16_t SqeCid(const Sqe& e) { return e.cdw0 >> 16; }
TUTTI_HD inline bool SqeUsesSgl(const Sqe& e) { return ((e.cdw0 >> 14) & 3) != 0; }

// Completion queue entry (base spec 4.6), 16 bytes, kept as four dwords so the one holding the
// phase bit can be read and written as a unit: DW0 command specific; DW2 SQ head [15:0], SQ id
// [31:16]; DW3 CID [15:0], phase [16], status [31:17] (SC [24:17], SCT [27:25], CRD, M, DNR [31]).
struct Cqe {
  uint32_t dw0;
  uint32_t dw1;
  uint32_t dw2;
  uint32_t dw3;
};
static_assert(sizeof(Cqe) == 16, "CQE is 16 bytes");
inline constexpr uint32_t kCqeSizeLog2 = 4;

TUTTI_HD inline uint16_t CqeSqHead(const Cqe& e) { return e.dw2 & 0xffff; }
TUTTI_HD inline uint16_t CqeSqId(const Cqe& e) { return e.dw2 >> 16; }
TUTTI_HD inline uint16_t CqeCid(uint32_t dw3) { return dw3 & 0xffff; }
TUTTI_HD inline uint32_t CqePhase(uint32_t dw3) { return (dw3 >> 16) & 1; }
// The status field without the phase bit: SCT << 8 | SC (the "status" this driver passes around).
TUTTI_HD inline uint16_t CqeStatus(uint32_t dw3) { return (dw3 >> 17) & 0x7ff; }
TUTTI_HD inline uint32_t CqeDw3(uint16_t cid, uint32_t phase, uint16_t status) {
  return cid | (phase << 16) | (static_cast<uint32_t>(status & 0x7ff) << 17);
}

// ---- Status codes (base spec 4.6.1.2), as SCT << 8 | SC ----------------------------------------
inline constexpr uint16_t kSctGeneric = 0;
inline constexpr uint16_t kSctCommandSpecific = 1;
inline constexpr uint16_t kSctMedia = 2;
TUTTI_HD inline constexpr uint16_t MakeStatus(uint16_t sct, uint16_t sc) {
  return static_cast<uint16_t>((sct << 8) | sc);
}
TUTTI_HD inline uint16_t StatusSct(uint16_t status) { return (status >> 8) & 7; }
TUTTI_HD inline uint16_t StatusSc(uint16_t status) { return status & 0xff; }

inline constexpr uint16_t kStatusSuccess = MakeStatus(kSctGeneric, 0x00);
inline constexpr uint16_t kStatusInvalidOpcode = MakeStatus(kSctGeneric, 0x01);
inline constexpr uint16_t kStatusInvalidField = MakeStatus(kSctGeneric, 0x02);
inline constexpr uint16_t kStatusCidConflict = MakeStatus(kSctGeneric, 0x03);
inline constexpr uint16_t kStatusDataTransferError = MakeStatus(kSctGeneric, 0x04);
inline constexpr uint16_t kStatusPowerLossAbort = MakeStatus(kSctGeneric, 0x05);
inline constexpr uint16_t kStatusInternalError = MakeStatus(kSctGeneric, 0x06);
inline constexpr uint16_t kStatusAbortRequested = MakeStatus(kSctGeneric, 0x07);
inline constexpr uint16_t kStatusSqDeletionAbort = MakeStatus(kSctGeneric, 0x08);
inline constexpr uint16_t kStatusInvalidNamespace = MakeStatus(kSctGeneric, 0x0b);
inline constexpr uint16_t kStatusCommandSequenceError = MakeStatus(kSctGeneric, 0x0c);
inline constexpr uint16_t kStatusInvalidSglSegment = MakeStatus(kSctGeneric, 0x0d);
inline constexpr uint16_t kStatusDataSglLengthInvalid = MakeStatus(kSctGeneric, 0x0f);
inline constexpr uint16_t kStatusSglTypeInvalid = MakeStatus(kSctGeneric, 0x11);
inline constexpr uint16_t kStatusPrpOffsetInvalid = MakeStatus(kSctGeneric, 0x13);
inline constexpr uint16_t kStatusLbaOutOfRange = MakeStatus(kSctGeneric, 0x80);
inline constexpr uint16_t kStatusCapacityExceeded = MakeStatus(kSctGeneric, 0x81);
inline constexpr uint16_t kStatusNamespaceNotReady = MakeStatus(kSctGeneric, 0x82);
inline constexpr uint16_t kStatusInvalidCqId = MakeStatus(kSctCommandSpecific, 0x00);
inline constexpr uint16_t kStatusInvalidQueueId = MakeStatus(kSctCommandSpecific, 0x01);
inline constexpr uint16_t kStatusInvalidQueueSize = MakeStatus(kSctCommandSpecific, 0x02);
inline constexpr uint16_t kStatusAbortLimitExceeded = MakeStatus(kSctCommandSpecific, 0x03);
inline constexpr uint16_t kStatusInvalidQueueDeletion = MakeStatus(kSctCommandSpecific, 0x0c);
inline constexpr uint16_t kStatusWriteFault = MakeStatus(kSctMedia, 0x80);
inline constexpr uint16_t kStatusUnrecoveredRead = MakeStatus(kSctMedia, 0x81);
inline constexpr uint16_t kStatusAccessDenied = MakeStatus(kSctMedia, 0x86);

// ---- Opcodes ------------------------------------------------------------------------------------
// Admin (base spec 5).
inline constexpr uint8_t kAdminDeleteIoSq = 0x00;
inline constexpr uint8_t kAdminCreateIoSq = 0x01;
inline constexpr uint8_t kAdminDeleteIoCq = 0x04;
inline constexpr uint8_t kAdminCreateIoCq = 0x05;
inline constexpr uint8_t kAdminIdentify = 0x06;
inline constexpr uint8_t kAdminAbort = 0x08;
inline constexpr uint8_t kAdminSetFeatures = 0x09;
inline constexpr uint8_t kAdminGetFeatures = 0x0a;
// NVM command set (NVM command set spec 3).
inline constexpr uint8_t kNvmFlush = 0x00;
inline constexpr uint8_t kNvmWrite = 0x01;
inline constexpr uint8_t kNvmRead = 0x02;

// Create I/O CQ: CDW10 QID [15:0], QSIZE-1 [31:16]; CDW11 PC [0], IEN [1], IV [31:16].
// Create I/O SQ: CDW10 as above; CDW11 PC [0], QPRIO [2:1], CQID [31:16].
// Delete: CDW10 QID. Abort: CDW10 SQID [15:0], CID [31:16]; completion DW0 bit 0 set = NOT aborted.
inline constexpr uint32_t kQueuePhysicallyContiguous = 1;
// Identify: CDW10 CNS [7:0].
inline constexpr uint32_t kCnsNamespace = 0x00;
inline constexpr uint32_t kCnsController = 0x01;
inline constexpr uint32_t kIdentifySize = 4096;
// Features (CDW10 FID [7:0]).
inline constexpr uint32_t kFeatureVolatileWriteCache = 0x06;
// Number of Queues: CDW11 NSQR-1 [15:0], NCQR-1 [31:16]; the completion's DW0 says what was granted
// in the same form.
inline constexpr uint32_t kFeatureNumberOfQueues = 0x07;
// Read/Write: CDW10-11 SLBA, CDW12 NLB-1 [15:0], FUA [30].
inline constexpr uint32_t kRwFua = 1u << 30;
inline constexpr uint32_t kMaxBlocksPerCommand = 65536;

// ---- Identify data (byte offsets) ---------------------------------------------------------------
// Controller (base spec 5.17.2.1, figure "Identify Controller Data Structure").
inline constexpr uint32_t kIdCtrlVid = 0;  // 2 bytes
inline constexpr uint32_t kIdCtrlSn = 4;   // 20 ASCII
inline constexpr uint32_t kIdCtrlMn = 24;  // 40 ASCII
inline constexpr uint32_t kIdCtrlFr = 64;  // 8 ASCII
inline constexpr uint32_t kIdCtrlMdts =
    77;  // log2 of max transfer in units of CAP.MPSMIN; 0 = none
inline constexpr uint32_t kIdCtrlCntlid = 78;  // 2 bytes
inline constexpr uint32_t kIdCtrlSqes = 512;   // required [3:0], max [7:4], log2 bytes
inline constexpr uint32_t kIdCtrlCqes = 513;
inline constexpr uint32_t kIdCtrlNn = 516;    // 4 bytes: number of namespaces
inline constexpr uint32_t kIdCtrlVwc = 525;   // bit 0: volatile write cache present
inline constexpr uint32_t kIdCtrlSgls = 536;  // 4 bytes; [1:0] 01 SGLs, 10 SGLs dword-aligned
// Namespace (NVM command set spec 4.1.5.1).
inline constexpr uint32_t kIdNsNsze = 0;    // 8 bytes, in LBAs
inline constexpr uint32_t kIdNsNcap = 8;    // 8 bytes
inline constexpr uint32_t kIdNsNlbaf = 25;  // number of LBA formats - 1
inline constexpr uint32_t kIdNsFlbas = 26;  // [3:0] format in use
inline constexpr uint32_t kIdNsLbaf = 128;  // 4 bytes each: MS [15:0], LBADS [23:16], RP [25:24]

// ---- Data pointers ------------------------------------------------------------------------------
// PRP (base spec 4.1.1): PRP1 is the first page's address (any dword offset); PRP2 is the second
// page when the transfer touches exactly two pages, else the address of a PRP list: 8-byte page
// addresses, the last entry of a list page pointing at the next list page when more are needed.
//
// SGL (base spec 4.1.2): 16-byte descriptors; byte 15 is the identifier, type [7:4] and subtype
// [3:0]. A data block descriptor is address (8), length (4), 3 reserved bytes, identifier 0x00.
struct SglDescriptor {
  uint64_t address;
  uint32_t length;
  uint8_t reserved[3];
  uint8_t identifier;
};
static_assert(sizeof(SglDescriptor) == 16, "SGL descriptor is 16 bytes");
inline constexpr uint8_t kSglDataBlock = 0x0 << 4;
inline constexpr uint8_t kSglBitBucket = 0x1 << 4;
inline constexpr uint8_t kSglSegment = 0x2 << 4;
inline constexpr uint8_t kSglLastSegment = 0x3 << 4;

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_SPEC_H_
