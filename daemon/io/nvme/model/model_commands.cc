// The commands the controller model serves: admin (Identify, queue creation and deletion, Abort,
// features) and NVM (Read, Write, Flush), with PRP and SGL data pointers walked as the spec says.
#include <algorithm>
#include <cstring>

#include "daemon/io/nvme/model/controller_model.h"

namespace tutti::io::nvme {
namespace {

constexpr uint64_t kPage = 4096;

uint16_t QueueId(const Sqe& e) { return e.cdw10 & 0xffff; }
uint32_t QueueSize(const Sqe& e) { return (e.cdw10 >> 16) + 1; }

void PutString(uint8_t* id, uint32_t offset, uint32_t width, const char* s) {
  std::memset(id + offset, ' ', width);
  std::memcpy(id + offset, s, std::min<size_t>(width, std::strlen(s)));
}

}  // namespace

ControllerModel::Done ControllerModel::Admin(uint16_t sqid, const Sqe& e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.admin;
  }
  Done d{sqid, SqeCid(e), kStatusSuccess, 0};
  switch (SqeOpcode(e)) {
    case kAdminIdentify:
      Identify(e, &d.status);
      break;
    case kAdminCreateIoCq:
      d.status = CreateCq(e);
      break;
    case kAdminCreateIoSq:
      d.status = CreateSq(e);
      break;
    case kAdminDeleteIoSq:
      d.status = DeleteSq(e);
      break;
    case kAdminDeleteIoCq:
      d.status = DeleteCq(e);
      break;
    case kAdminAbort:
      return AbortCommand(sqid, e);
    case kAdminSetFeatures:
    case kAdminGetFeatures: {
      uint32_t fid = e.cdw10 & 0xff;
      if (fid == kFeatureNumberOfQueues) {
        uint32_t n = options_.max_io_queues - 1;
        d.dw0 = n | (n << 16);
      } else if (fid == kFeatureVolatileWriteCache && options_.volatile_write_cache) {
        if (SqeOpcode(e) == kAdminSetFeatures) vwc_enabled_ = e.cdw11 & 1;
        d.dw0 = vwc_enabled_ ? 1 : 0;
      } else {
        d.status = kStatusInvalidField;
      }
      break;
    }
    default:
      d.status = kStatusInvalidOpcode;
  }
  return d;
}

void ControllerModel::Identify(const Sqe& e, uint16_t* status) {
  uint8_t* id = Translate(e.dptr[0], kIdentifySize);
  if (id == nullptr) {
    *status = kStatusDataTransferError;
    return;
  }
  std::memset(id, 0, kIdentifySize);
  uint32_t cns = e.cdw10 & 0xff;
  if (cns == kCnsController) {
    PutString(id, kIdCtrlSn, 20, "TUTTIMODEL0001");
    PutString(id, kIdCtrlMn, 40, "tutti nvme controller model");
    PutString(id, kIdCtrlFr, 8, "1.0");
    id[kIdCtrlMdts] = static_cast<uint8_t>(options_.mdts);
    id[kIdCtrlSqes] = 0x66;
    id[kIdCtrlCqes] = 0x44;
    id[kIdCtrlNn] = 1;
    id[kIdCtrlVwc] = options_.volatile_write_cache ? 1 : 0;
    id[kIdCtrlSgls] = options_.sgl ? 1 : 0;
  } else if (cns == kCnsNamespace && e.nsid == 1) {
    uint64_t n = options_.namespace_blocks;
    std::memcpy(id + kIdNsNsze, &n, 8);
    std::memcpy(id + kIdNsNcap, &n, 8);
    id[kIdNsLbaf + 2] = static_cast<uint8_t>(options_.lba_shift);  // LBAF0 LBADS
  } else {
    *status = cns == kCnsNamespace ? kStatusInvalidNamespace : kStatusInvalidField;
  }
}

uint16_t ControllerModel::CreateCq(const Sqe& e) {
  uint16_t qid = QueueId(e);
  uint32_t depth = QueueSize(e);
  if (qid == 0 || qid >= cqs_.size() || cqs_[qid].live) return kStatusInvalidQueueId;
  if (depth < 2 || depth > options_.max_queue_entries) return kStatusInvalidQueueSize;
  if (!(e.cdw11 & kQueuePhysicallyContiguous)) return kStatusInvalidField;
  auto* ring = reinterpret_cast<Cqe*>(Translate(e.dptr[0], depth * sizeof(Cqe)));
  if (ring == nullptr) return kStatusDataTransferError;
  cqs_[qid] = Cq{true, ring, depth, 0, 1, {}};
  return kStatusSuccess;
}

uint16_t ControllerModel::CreateSq(const Sqe& e) {
  uint16_t qid = QueueId(e), cqid = e.cdw11 >> 16;
  uint32_t depth = QueueSize(e);
  if (qid == 0 || qid >= sqs_.size() || sqs_[qid].live) return kStatusInvalidQueueId;
  if (cqid == 0 || cqid >= cqs_.size() || !cqs_[cqid].live) return kStatusInvalidCqId;
  if (depth < 2 || depth > options_.max_queue_entries) return kStatusInvalidQueueSize;
  if (!(e.cdw11 & kQueuePhysicallyContiguous)) return kStatusInvalidField;
  auto* ring = reinterpret_cast<Sqe*>(Translate(e.dptr[0], depth * sizeof(Sqe)));
  if (ring == nullptr) return kStatusDataTransferError;
  sqs_[qid] = Sq{true, ring, depth, 0, cqid};
  return kStatusSuccess;
}

// Held commands of the queue complete as aborted by the deletion (base spec 5.6).
uint16_t ControllerModel::DeleteSq(const Sqe& e) {
  uint16_t qid = QueueId(e);
  if (qid == 0 || qid >= sqs_.size() || !sqs_[qid].live) return kStatusInvalidQueueId;
  for (const Held& h : held_) {
    if (h.sqid == qid) Post(Done{qid, h.cid, kStatusSqDeletionAbort, 0});
  }
  held_.erase(
      std::remove_if(held_.begin(), held_.end(), [qid](const Held& h) { return h.sqid == qid; }),
      held_.end());
  sqs_[qid] = Sq{};
  SetReg(SqTailDoorbell(qid, options_.doorbell_stride), 0);
  return kStatusSuccess;
}

uint16_t ControllerModel::DeleteCq(const Sqe& e) {
  uint16_t qid = QueueId(e);
  if (qid == 0 || qid >= cqs_.size() || !cqs_[qid].live) return kStatusInvalidQueueId;
  for (const Sq& s : sqs_) {
    if (s.live && s.cqid == qid) return kStatusInvalidQueueDeletion;
  }
  cqs_[qid] = Cq{};
  SetReg(CqHeadDoorbell(qid, options_.doorbell_stride), 0);
  return kStatusSuccess;
}

// Aborts a held command (completing it with Abort Requested); DW0 bit 0 set when there was none.
ControllerModel::Done ControllerModel::AbortCommand(uint16_t sqid, const Sqe& e) {
  uint16_t target_sq = e.cdw10 & 0xffff, target_cid = e.cdw10 >> 16;
  auto it = std::find_if(held_.begin(), held_.end(),
                         [&](const Held& h) { return h.sqid == target_sq && h.cid == target_cid; });
  if (it == held_.end()) return Done{sqid, SqeCid(e), kStatusSuccess, 1};
  held_.erase(it);
  Post(Done{target_sq, target_cid, kStatusAbortRequested, 0});
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.aborts;
  return Done{sqid, SqeCid(e), kStatusSuccess, 0};
}

uint16_t ControllerModel::ReadWrite(const Sqe& e) {
  uint8_t op = SqeOpcode(e);
  if (e.nsid != 1) return kStatusInvalidNamespace;
  if (op == kNvmFlush) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.flushes;
    return kStatusSuccess;
  }
  if (op != kNvmRead && op != kNvmWrite) return kStatusInvalidOpcode;
  uint64_t slba = e.cdw10 | (static_cast<uint64_t>(e.cdw11) << 32);
  uint64_t blocks = (e.cdw12 & 0xffff) + 1;
  if (slba >= options_.namespace_blocks || blocks > options_.namespace_blocks - slba) {
    return kStatusLbaOutOfRange;
  }
  uint64_t len = blocks << options_.lba_shift;
  if (options_.mdts != 0 && len > (kPage << options_.mdts)) return kStatusInvalidField;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++(op == kNvmRead ? counters_.reads : counters_.writes);
  }
  uint8_t* media = media_.data() + (slba << options_.lba_shift);
  return Transfer(e, media, static_cast<uint32_t>(len), op == kNvmRead);
}

uint16_t ControllerModel::Transfer(const Sqe& e, uint8_t* media, uint32_t len, bool to_host) {
  if (!SqeUsesSgl(e)) return TransferPrp(e, media, len, to_host);
  if (!options_.sgl) return kStatusInvalidField;
  return TransferSgl(e, media, len, to_host);
}

namespace {
bool Copy(uint8_t* host, uint8_t* media, uint64_t n, bool to_host) {
  if (host == nullptr) return false;
  if (to_host) {
    std::memcpy(host, media, n);
  } else {
    std::memcpy(media, host, n);
  }
  return true;
}
}  // namespace

// PRP1 (any dword offset), then PRP2 as the second page or a PRP list whose last entry in each
// list page chains to the next when more entries are needed (base spec 4.1.1).
uint16_t ControllerModel::TransferPrp(const Sqe& e, uint8_t* media, uint32_t len, bool to_host) {
  uint64_t prp1 = e.dptr[0];
  if (prp1 % 4 != 0) return kStatusPrpOffsetInvalid;
  uint64_t first = std::min<uint64_t>(len, kPage - prp1 % kPage);
  if (!Copy(Translate(prp1, first), media, first, to_host)) return kStatusDataTransferError;
  uint64_t done = first;
  if (done == len) return kStatusSuccess;
  if (len - done <= kPage) {
    if (e.dptr[1] % kPage != 0) return kStatusPrpOffsetInvalid;
    bool ok = Copy(Translate(e.dptr[1], len - done), media + done, len - done, to_host);
    return ok ? kStatusSuccess : kStatusDataTransferError;
  }
  uint64_t entry_addr = e.dptr[1];
  if (entry_addr % 8 != 0) return kStatusPrpOffsetInvalid;
  while (done < len) {
    uint64_t remaining_pages = (len - done + kPage - 1) / kPage;
    auto* entry = reinterpret_cast<uint64_t*>(Translate(entry_addr, 8));
    if (entry == nullptr) return kStatusDataTransferError;
    bool last_in_page = (entry_addr + 8) % kPage == 0;
    if (last_in_page && remaining_pages > 1) {  // a chain pointer to the next list page
      entry_addr = *entry;
      if (entry_addr % 8 != 0) return kStatusPrpOffsetInvalid;
      continue;
    }
    if (*entry % kPage != 0) return kStatusPrpOffsetInvalid;
    uint64_t n = std::min<uint64_t>(kPage, len - done);
    if (!Copy(Translate(*entry, n), media + done, n, to_host)) return kStatusDataTransferError;
    done += n;
    entry_addr += 8;
  }
  return kStatusSuccess;
}

// SGL1 is a data block descriptor, or a (last) segment descriptor pointing at a list of data
// block descriptors.
uint16_t ControllerModel::TransferSgl(const Sqe& e, uint8_t* media, uint32_t len, bool to_host) {
  SglDescriptor d;
  std::memcpy(&d, e.dptr, sizeof(d));
  const SglDescriptor* list = &d;
  uint32_t count = 1;
  uint8_t type = d.identifier & 0xf0;
  if (type == kSglSegment || type == kSglLastSegment) {
    if (d.length % sizeof(SglDescriptor) != 0) return kStatusInvalidSglSegment;
    list = reinterpret_cast<const SglDescriptor*>(Translate(d.address, d.length));
    if (list == nullptr) return kStatusDataTransferError;
    count = d.length / sizeof(SglDescriptor);
  }
  uint64_t done = 0;
  for (uint32_t i = 0; i < count; ++i) {
    if ((list[i].identifier & 0xf0) != kSglDataBlock) return kStatusSglTypeInvalid;
    uint64_t n = list[i].length;
    if (n > len - done) return kStatusDataSglLengthInvalid;
    if (!Copy(Translate(list[i].address, n), media + done, n, to_host)) {
      return kStatusDataTransferError;
    }
    done += n;
  }
  return done == len ? kStatusSuccess : kStatusDataSglLengthInvalid;
}

}  // namespace tutti::io::nvme
