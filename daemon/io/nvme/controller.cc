#include "daemon/io/nvme/controller.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/io/nvme/queue_pair.h"
#include "daemon/io/nvme/status_text.h"

namespace tutti::io::nvme {
namespace {

constexpr uint32_t kPageShift = 12;

std::string IdString(const uint8_t* id, uint32_t offset, uint32_t width) {
  std::string s(reinterpret_cast<const char*>(id + offset), width);
  s.erase(s.find_last_not_of(" \0", std::string::npos, 2) + 1);
  return s;
}

uint32_t Le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

Controller::Controller(const ControllerOptions& options, RegisterSpace* regs, DmaAllocator* dma)
    : options_(options),
      regs_(regs),
      dma_(dma),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()) {}

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(const ControllerOptions& options,
                                                               RegisterSpace* regs,
                                                               DmaAllocator* dma) {
  if (options.io_queues == 0 || options.io_queue_depth < 2 || options.admin_queue_depth < 2 ||
      options.admin_queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.name, ": io_queues must be >= 1, io_queue_depth >= 2, admin_queue_depth 2..4096"));
  }
  std::unique_ptr<Controller> c(new Controller(options, regs, dma));
  RETURN_IF_ERROR(c->Init());
  return c;
}

Controller::~Controller() {
  if (!shut_down_ && usable_) {
    absl::Status s = Shutdown();
    if (!s.ok())
      log::Get("nvme")->warn("{}: shutdown at destruction: {}", options_.name, s.ToString());
  }
}

absl::Status Controller::Init() {
  cap_ = regs_->Read64(kRegCap);
  info_.version = regs_->Read32(kRegVs);
  info_.max_queue_entries = CapMqes(cap_);
  info_.doorbell_stride = CapDstrd(cap_);
  info_.ready_timeout_ms = CapTimeoutMs(cap_);
  if (CapMpsMinShift(cap_) > kPageShift || CapMpsMaxShift(cap_) < kPageShift) {
    return absl::FailedPreconditionError(absl::StrCat(
        options_.name, ": controller does not support 4 KiB memory pages (CAP.MPSMIN 2^",
        CapMpsMinShift(cap_), ", MPSMAX 2^", CapMpsMaxShift(cap_), ")"));
  }
  if (!CapNvmCommandSet(cap_)) {
    return absl::FailedPreconditionError(options_.name + ": CAP.CSS lacks the NVM command set");
  }
  const uint32_t admin_depth = std::min(options_.admin_queue_depth, info_.max_queue_entries);
  ASSIGN_OR_RETURN(admin_sq_mem_, dma_->Allocate(admin_depth * sizeof(Sqe)));
  ASSIGN_OR_RETURN(admin_cq_mem_, dma_->Allocate(admin_depth * sizeof(Cqe)));
  ASSIGN_OR_RETURN(identify_mem_, dma_->Allocate(kIdentifySize));
  {
    absl::MutexLock lock(&mu_);
    admin_.qid = 0;
    admin_.sq = SubmissionRing{reinterpret_cast<Sqe*>(admin_sq_mem_->host()),
                               regs_->DoorbellAddress(SqTailDoorbell(0, info_.doorbell_stride)),
                               admin_depth};
    admin_.cq = CompletionRing{reinterpret_cast<Cqe*>(admin_cq_mem_->host()),
                               regs_->DoorbellAddress(CqHeadDoorbell(0, info_.doorbell_stride)),
                               admin_depth};
  }
  RETURN_IF_ERROR(Disable());
  RETURN_IF_ERROR(Enable());
  RETURN_IF_ERROR(IdentifyController());
  RETURN_IF_ERROR(IdentifyNamespace());
  desc_options_.page_shift = kPageShift;
  desc_options_.use_sgl = options_.use_sgl && info_.sgl;
  desc_options_.max_transfer = options_.max_transfer;
  if (info_.mdts_bytes != 0) {
    desc_options_.max_transfer = std::min(desc_options_.max_transfer, info_.mdts_bytes);
  }
  RETURN_IF_ERROR(CreateQueuePairs(options_.io_queues));
  usable_ = true;
  log::Get("nvme")->info(
      "{}: {} (SN {}, FR {}), ns {} {} x {} B, {} queue pair(s) x {}, {}, VWC {}, max transfer {}",
      options_.name, info_.model, info_.serial, info_.firmware, ns_.nsid, ns_.blocks,
      ns_.lba_size(), queue_pairs_.size(), options_.io_queue_depth,
      desc_options_.use_sgl ? "SGL" : "PRP", info_.volatile_write_cache, max_transfer());
  return absl::OkStatus();
}

absl::Status Controller::WaitReady(bool ready, absl::string_view what) {
  const int64_t deadline = clock_->NowMs() + std::max<uint32_t>(info_.ready_timeout_ms, 500);
  for (;;) {
    uint32_t csts = regs_->Read32(kRegCsts);
    if (((csts & kCstsReady) != 0) == ready && !(ready && (csts & kCstsFatal))) {
      return absl::OkStatus();
    }
    if (ready && (csts & kCstsFatal)) {
      return absl::UnavailableError(
          absl::StrCat(options_.name, ": ", what, ": controller fatal status (CSTS.CFS) set"));
    }
    if (clock_->NowMs() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          options_.name, ": ", what, ": CSTS.RDY did not become ", ready ? 1 : 0, " within ",
          info_.ready_timeout_ms, " ms (CAP.TO); CSTS 0x", absl::Hex(csts)));
    }
    std::this_thread::yield();
  }
}

absl::Status Controller::Disable() {
  uint32_t cc = regs_->Read32(kRegCc);
  if (cc & kCcEnable) regs_->Write32(kRegCc, cc & ~kCcEnable);
  return WaitReady(false, "disable");
}

// Programs the admin queue from a clean ring and enables the controller.
absl::Status Controller::Enable() {
  {
    absl::MutexLock lock(&mu_);
    std::memset(admin_cq_mem_->host(), 0, admin_cq_mem_->size());
    ResetRing(&admin_);
    regs_->Write32(kRegAqa, Aqa(admin_.sq.depth, admin_.cq.depth));
  }
  regs_->Write64(kRegAsq, admin_sq_mem_->iova());
  regs_->Write64(kRegAcq, admin_cq_mem_->iova());
  regs_->Write32(kRegCc,
                 kCcEnable | CcMps(kPageShift) | CcIoQueueEntrySizes(kSqeSizeLog2, kCqeSizeLog2));
  return WaitReady(true, "enable");
}

absl::Status Controller::IdentifyController() {
  Sqe e = {};
  e.cdw0 = Cdw0(kAdminIdentify, 0, kPsdtPrp);
  e.dptr[0] = identify_mem_->iova();
  e.cdw10 = kCnsController;
  ASSIGN_OR_RETURN(uint32_t dw0, AdminCommand(e, "Identify Controller"));
  (void)dw0;
  const uint8_t* id = identify_mem_->host();
  info_.serial = IdString(id, kIdCtrlSn, 20);
  info_.model = IdString(id, kIdCtrlMn, 40);
  info_.firmware = IdString(id, kIdCtrlFr, 8);
  uint32_t mdts = id[kIdCtrlMdts];
  info_.mdts_bytes = mdts == 0 || mdts > 19 ? 0 : (1u << (mdts + CapMpsMinShift(cap_)));
  info_.num_namespaces = Le32(id + kIdCtrlNn);
  info_.volatile_write_cache = id[kIdCtrlVwc] & 1;
  info_.sgl = (Le32(id + kIdCtrlSgls) & 3) != 0;
  if ((id[kIdCtrlSqes] & 0xf) > kSqeSizeLog2 || (id[kIdCtrlCqes] & 0xf) > kCqeSizeLog2) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.name, ": controller requires larger queue entries (SQES 0x",
                     absl::Hex(id[kIdCtrlSqes]), ", CQES 0x", absl::Hex(id[kIdCtrlCqes]), ")"));
  }
  return absl::OkStatus();
}

absl::Status Controller::IdentifyNamespace() {
  Sqe e = {};
  e.cdw0 = Cdw0(kAdminIdentify, 0, kPsdtPrp);
  e.nsid = options_.nsid;
  e.dptr[0] = identify_mem_->iova();
  e.cdw10 = kCnsNamespace;
  ASSIGN_OR_RETURN(uint32_t dw0,
                   AdminCommand(e, absl::StrCat("Identify Namespace ", options_.nsid)));
  (void)dw0;
  const uint8_t* id = identify_mem_->host();
  ns_.nsid = options_.nsid;
  std::memcpy(&ns_.blocks, id + kIdNsNsze, 8);
  uint32_t format = id[kIdNsFlbas] & 0xf;
  uint32_t lbaf = Le32(id + kIdNsLbaf + 4 * format);
  ns_.lba_shift = (lbaf >> 16) & 0xff;
  if (ns_.blocks == 0 || ns_.lba_shift < 9 || ns_.lba_shift > kPageShift || (lbaf & 0xffff) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        options_.name, ": namespace ", options_.nsid, " unusable: ", ns_.blocks, " blocks, LBA 2^",
        ns_.lba_shift, " bytes, ", lbaf & 0xffff, " metadata bytes (need 512..4096, no metadata)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RegisteredRegion>> Controller::Register(const DmaBuffer& buffer) {
  return RegisteredRegion::Create(desc_options_, buffer, dma_);
}

bool Controller::Fatal() const { return (regs_->Read32(kRegCsts) & kCstsFatal) != 0; }

uint64_t Controller::resets() const {
  absl::MutexLock lock(&mu_);
  return resets_;
}

}  // namespace tutti::io::nvme
