#include "daemon/io/nvme/model/controller_model.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tutti::io::nvme {
namespace {

constexpr uint64_t kPage = 4096;

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// A buffer of the model's DMA space; unregisters itself (and frees what it allocated).
class ModelBuffer final : public DmaBuffer {
 public:
  ModelBuffer(ControllerModel* model, uint8_t* host, uint64_t iova, size_t size, bool owned)
      : model_(model), host_(host), iova_(iova), size_(size), owned_(owned) {}
  ~ModelBuffer() override {
    model_->Unregister(iova_);
    if (owned_) std::free(host_);
  }
  uint8_t* host() const override { return host_; }
  uint64_t iova() const override { return iova_; }
  size_t size() const override { return size_; }

 private:
  ControllerModel* const model_;
  uint8_t* const host_;
  const uint64_t iova_;
  const size_t size_;
  const bool owned_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ControllerModel>> ControllerModel::Create(const ModelOptions& o) {
  if (o.max_queue_entries < 2 || o.max_queue_entries > 65536 || o.max_io_queues < 1 ||
      o.max_io_queues > 1024 || o.doorbell_stride > 15 || o.timeout_units == 0 ||
      (o.lba_shift != 9 && o.lba_shift != 12) || o.namespace_blocks == 0) {
    return absl::InvalidArgumentError(
        "ModelOptions out of range (queue entries 2..65536, "
        "io queues 1..1024, stride <= 15, TO > 0, LBA 512 or 4096)");
  }
  return std::unique_ptr<ControllerModel>(new ControllerModel(o));
}

ControllerModel::ControllerModel(const ModelOptions& o)
    : options_(o),
      reg_bytes_(RoundUp(CqHeadDoorbell(o.max_io_queues, o.doorbell_stride) + 4, kPage)),
      regs_(static_cast<uint32_t*>(std::aligned_alloc(kPage, reg_bytes_))),
      media_(o.namespace_blocks << o.lba_shift),
      sqs_(o.max_io_queues + 1),
      cqs_(o.max_io_queues + 1) {
  std::memset(regs_, 0, reg_bytes_);
  uint64_t cap = (o.max_queue_entries - 1) | (1ull << 16) /* CQR */ |
                 (static_cast<uint64_t>(o.timeout_units) << 24) |
                 (static_cast<uint64_t>(o.doorbell_stride) << 32) | (1ull << 37) /* NVM */;
  SetReg(kRegCap, static_cast<uint32_t>(cap));
  SetReg(kRegCap + 4, static_cast<uint32_t>(cap >> 32));
  SetReg(kRegVs, 0x00010400);  // 1.4
  thread_ = std::thread([this] { Run(); });
}

ControllerModel::~ControllerModel() {
  stop_ = true;
  thread_.join();
  std::free(regs_);
}

uint32_t ControllerModel::Reg(uint32_t offset) const {
  return __atomic_load_n(&regs_[offset / 4], __ATOMIC_ACQUIRE);
}
void ControllerModel::SetReg(uint32_t offset, uint32_t value) {
  __atomic_store_n(&regs_[offset / 4], value, __ATOMIC_RELEASE);
}

uint32_t ControllerModel::Read32(size_t offset) const { return Reg(offset); }
uint64_t ControllerModel::Read64(size_t offset) const {
  return Reg(offset) | (static_cast<uint64_t>(Reg(offset + 4)) << 32);
}

void ControllerModel::Write32(size_t offset, uint32_t value) {
  bool writable = offset == kRegCc || offset == kRegAqa || (offset >= kRegAsq && offset < 0x38) ||
                  (offset >= kRegDoorbells && offset < reg_bytes_);
  if (writable) SetReg(offset, value);
}
void ControllerModel::Write64(size_t offset, uint64_t value) {
  Write32(offset, static_cast<uint32_t>(value));
  Write32(offset + 4, static_cast<uint32_t>(value >> 32));
}

volatile uint32_t* ControllerModel::DoorbellAddress(size_t offset) {
  if (offset < kRegDoorbells || offset >= reg_bytes_ || offset % 4 != 0) return nullptr;
  return &regs_[offset / 4];
}

absl::StatusOr<std::unique_ptr<DmaBuffer>> ControllerModel::Allocate(size_t size) {
  size_t bytes = RoundUp(std::max<size_t>(size, 1), kPage);
  auto* host = static_cast<uint8_t*>(std::aligned_alloc(kPage, bytes));
  if (host == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model DMA: cannot allocate ", bytes, " bytes"));
  }
  std::memset(host, 0, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t iova = next_iova_;
  next_iova_ += bytes + kPage;
  regions_[iova] = Region{host, bytes};
  return std::unique_ptr<DmaBuffer>(new ModelBuffer(this, host, iova, bytes, /*owned=*/true));
}

absl::StatusOr<std::unique_ptr<DmaBuffer>> ControllerModel::Map(uint8_t* memory, size_t size) {
  if (reinterpret_cast<uintptr_t>(memory) % kPage != 0 || size == 0) {
    return absl::InvalidArgumentError("model DMA: Map needs page-aligned, non-empty memory");
  }
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t iova = next_iova_;
  next_iova_ += RoundUp(size, kPage) + kPage;
  regions_[iova] = Region{memory, size};
  return std::unique_ptr<DmaBuffer>(new ModelBuffer(this, memory, iova, size, /*owned=*/false));
}

void ControllerModel::Unregister(uint64_t iova) {
  std::lock_guard<std::mutex> lock(mu_);
  regions_.erase(iova);
}

uint8_t* ControllerModel::Translate(uint64_t iova, uint64_t len) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.upper_bound(iova);
  if (it == regions_.begin()) return nullptr;
  --it;
  uint64_t off = iova - it->first;
  if (off > it->second.size || len > it->second.size - off) return nullptr;
  return it->second.host + off;
}

void ControllerModel::AddFault(const FaultRule& rule) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(rule);
}
void ControllerModel::ClearFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.clear();
}
void ControllerModel::SetFatal() {
  fatal_ = true;
  __atomic_fetch_or(&regs_[kRegCsts / 4], kCstsFatal, __ATOMIC_ACQ_REL);
}
ModelCounters ControllerModel::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

// ---- The model's thread -------------------------------------------------------------------------

void ControllerModel::Run() {
  int idle = 0;
  while (!stop_) {
    if (Step()) {
      idle = 0;
    } else if (++idle < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

bool ControllerModel::Step() {
  uint32_t cc = Reg(kRegCc);
  if (!enabled_) {
    if (!(cc & kCcEnable)) {
      enable_at_us_ = 0;
      return false;
    }
    if (enable_at_us_ == 0) enable_at_us_ = NowUs() + options_.ready_delay_us;
    if (NowUs() >= enable_at_us_) Enable();
    return true;
  }
  if (!(cc & kCcEnable)) {
    Disable();
    return true;
  }
  StepShutdown(cc);
  if (fatal_) return false;
  bool busy = false;
  for (uint16_t q = 0; q < sqs_.size(); ++q) {
    if (sqs_[q].live) busy |= ServeQueue(q);
  }
  for (uint16_t q = 0; q < cqs_.size(); ++q) {
    if (cqs_[q].live) busy |= DrainBacklog(q);
  }
  return busy;
}

void ControllerModel::Enable() {
  uint32_t aqa = Reg(kRegAqa);
  uint64_t asq = Reg(kRegAsq) | (static_cast<uint64_t>(Reg(kRegAsq + 4)) << 32);
  uint64_t acq = Reg(kRegAcq) | (static_cast<uint64_t>(Reg(kRegAcq + 4)) << 32);
  uint32_t sq_depth = (aqa & 0xfff) + 1, cq_depth = ((aqa >> 16) & 0xfff) + 1;
  auto* sq = reinterpret_cast<Sqe*>(Translate(asq, sq_depth * sizeof(Sqe)));
  auto* cq = reinterpret_cast<Cqe*>(Translate(acq, cq_depth * sizeof(Cqe)));
  enabled_ = true;
  if (sq == nullptr || cq == nullptr || sq_depth < 2 || cq_depth < 2) {
    fatal_ = true;  // a real controller reports bad admin queue addresses as CFS
    __atomic_fetch_or(&regs_[kRegCsts / 4], kCstsFatal | kCstsReady, __ATOMIC_ACQ_REL);
    return;
  }
  sqs_[0] = Sq{true, sq, sq_depth, 0, 0};
  cqs_[0] = Cq{true, cq, cq_depth, 0, 1, {}};
  __atomic_fetch_or(&regs_[kRegCsts / 4], kCstsReady, __ATOMIC_ACQ_REL);
}

void ControllerModel::Disable() {
  for (auto& s : sqs_) s = Sq{};
  for (auto& c : cqs_) c = Cq{};
  held_.clear();
  for (uint32_t q = 0; q < sqs_.size(); ++q) {
    SetReg(SqTailDoorbell(q, options_.doorbell_stride), 0);
    SetReg(CqHeadDoorbell(q, options_.doorbell_stride), 0);
  }
  enabled_ = false;
  enable_at_us_ = 0;
  shutdown_at_us_ = 0;
  fatal_ = false;
  SetReg(kRegCsts, 0);
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.resets;
}

void ControllerModel::StepShutdown(uint32_t cc) {
  uint32_t shst = Reg(kRegCsts) & kCstsShstMask;
  if ((cc & kCcShnMask) == 0 || shst == kCstsShstComplete) return;
  if (shst == 0) {
    shutdown_at_us_ = NowUs() + options_.shutdown_delay_us;
    __atomic_fetch_or(&regs_[kRegCsts / 4], kCstsShstOccurring, __ATOMIC_ACQ_REL);
  } else if (NowUs() >= shutdown_at_us_) {
    uint32_t csts = (Reg(kRegCsts) & ~kCstsShstMask) | kCstsShstComplete;
    SetReg(kRegCsts, csts);
  }
}

// Fetches every entry up to the SQ tail doorbell and serves it; returns whether there was any.
bool ControllerModel::ServeQueue(uint16_t sqid) {
  Sq& sq = sqs_[sqid];
  uint32_t tail = Reg(SqTailDoorbell(sqid, options_.doorbell_stride));
  if (tail >= sq.depth || tail == sq.head) return false;
  std::vector<Done> done;
  while (sq.head != tail && sqs_[sqid].live) {
    Sqe e = sq.ring[sq.head];
    sq.head = (sq.head + 1) % sq.depth;
    Serve(sqid, e, &done);
  }
  if (options_.reorder && sqid != 0) std::reverse(done.begin(), done.end());
  for (const Done& d : done) Post(d);
  return true;
}

void ControllerModel::Serve(uint16_t sqid, const Sqe& e, std::vector<Done>* out) {
  if (ApplyFault(sqid, e, out)) return;
  if (sqid == 0) {
    Done d = Admin(sqid, e);
    if (SqeOpcode(e) == kAdminAbort && d.status == kStatusSuccess && (d.dw0 & 1) == 0) {
      Post(d);  // the Abort completes after the aborted command (posted by AbortCommand)
      return;
    }
    out->push_back(d);
    return;
  }
  out->push_back(Done{sqid, SqeCid(e), ReadWrite(e), 0});
}

// Applies the first matching fault rule. Returns true if the command is dealt with (completed
// with a status, held, or executed without a completion).
bool ControllerModel::ApplyFault(uint16_t sqid, const Sqe& e, std::vector<Done>* out) {
  FaultRule rule;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t slba = e.cdw10 | (static_cast<uint64_t>(e.cdw11) << 32);
    auto it = std::find_if(faults_.begin(), faults_.end(), [&](const FaultRule& r) {
      return r.admin == (sqid == 0) && (r.opcode < 0 || r.opcode == SqeOpcode(e)) &&
             (r.slba < 0 || (sqid != 0 && static_cast<uint64_t>(r.slba) == slba));
    });
    if (it == faults_.end()) return false;
    rule = *it;
    if (it->times > 0 && --it->times == 0) faults_.erase(it);
    ++counters_.faults;
  }
  switch (rule.action) {
    case FaultAction::kStatus:
      out->push_back(Done{sqid, SqeCid(e), rule.status, 0});
      return true;
    case FaultAction::kStall:
      held_.push_back(Held{sqid, SqeCid(e)});
      return true;
    case FaultAction::kDropCompletion:
      if (sqid == 0) {
        Admin(sqid, e);
      } else {
        ReadWrite(e);
      }
      return true;
  }
  return false;
}

void ControllerModel::Post(const Done& d) {
  uint16_t cqid = sqs_[d.sqid].cqid;
  Cq& cq = cqs_[cqid];
  if (!cq.live) return;
  Cqe c{d.dw0, 0, static_cast<uint32_t>(sqs_[d.sqid].head) | (uint32_t{d.sqid} << 16), 0};
  c.dw3 = CqeDw3(d.cid, 0, d.status);  // phase filled when written
  cq.backlog.push_back(c);
  DrainBacklog(cqid);
}

// Writes waiting completions while the CQ has room (the host's head doorbell says how much).
bool ControllerModel::DrainBacklog(uint16_t cqid) {
  Cq& cq = cqs_[cqid];
  if (cq.backlog.empty()) return false;
  uint32_t head = Reg(CqHeadDoorbell(cqid, options_.doorbell_stride));
  size_t written = 0;
  while (written < cq.backlog.size() && (cq.tail + 1) % cq.depth != head) {
    const Cqe& c = cq.backlog[written++];
    Cqe* slot = &cq.ring[cq.tail];
    slot->dw0 = c.dw0;
    slot->dw1 = 0;
    slot->dw2 = c.dw2;
    __atomic_store_n(&slot->dw3, c.dw3 | (cq.phase << 16), __ATOMIC_RELEASE);
    if (++cq.tail == cq.depth) {
      cq.tail = 0;
      cq.phase ^= 1;
    }
  }
  cq.backlog.erase(cq.backlog.begin(), cq.backlog.begin() + written);
  return written > 0;
}

}  // namespace tutti::io::nvme
