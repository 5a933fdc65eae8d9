// A software NVMe controller in a host thread, for tests without hardware: it implements the
// register seam (RegisterSpace: CAP/VS/CC/CSTS/AQA/ASQ/ACQ and doorbells) and the DMA seam
// (DmaAllocator: host memory under fake IOVAs, and a table it "DMAs" through), and serves the
// admin and NVM commands the driver uses from a namespace in host memory.
//
// Register semantics: CC.EN 0->1 sets CSTS.RDY after `ready_delay_us` (reading AQA/ASQ/ACQ then);
// CC.EN 1->0 is a controller reset (every queue deleted, in-flight commands dropped, CSTS.CFS
// cleared); CC.SHN sets CSTS.SHST to "occurring", then "complete" after `shutdown_delay_us`.
// Doorbells are plain words that the model's thread polls; DoorbellAddress() hands them out so
// a GPU can ring them once the memory is registered for CUDA.
//
// Faults (AddFault): a status for chosen commands, a stall (never completes: only Abort or a
// reset ends it), a dropped completion (the command executes, no CQE is posted), completions in
// reverse order within each batch the model fetches (ModelOptions::reorder), a fatal status
// (SetFatal: CSTS.CFS, nothing more is served until a reset), SGL support on or off.
//
// For the GPU path (later): every byte the controller reaches -- queue rings, PRP lists, data --
// comes from this one DmaAllocator, so a CUDA build can back Allocate() with cudaHostAlloc (or
// cudaHostRegister the buffers, and the register block for the doorbells) and hand the device
// pointers to the kernel; the model keeps addressing the same memory by IOVA.
//
// Thread-safety: every public method is thread-safe. The namespace bytes (namespace_data) may be
// read by a test only while no write is in flight.
#ifndef TUTTI_DAEMON_IO_NVME_MODEL_CONTROLLER_MODEL_H_
#define TUTTI_DAEMON_IO_NVME_MODEL_CONTROLLER_MODEL_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/io/nvme/device.h"
#include "daemon/io/nvme/spec.h"

namespace tutti::io::nvme {

struct ModelOptions {
  uint64_t namespace_blocks = 8192;
  uint32_t lba_shift = 12;            // 9: 512-byte LBAs
  uint32_t max_queue_entries = 1024;  // CAP.MQES + 1
  uint32_t max_io_queues = 8;         // what Set Features (Number of Queues) grants at most
  uint32_t doorbell_stride = 0;       // CAP.DSTRD: doorbells 4 << DSTRD bytes apart
  uint32_t mdts = 5;                  // Identify MDTS: 2^mdts * 4 KiB per command (0: no limit)
  bool sgl = true;                    // Identify SGLS: SGLs supported
  bool volatile_write_cache = true;   // Identify VWC
  uint32_t timeout_units = 2;         // CAP.TO, 500 ms units
  int64_t ready_delay_us = 200;
  int64_t shutdown_delay_us = 200;
  bool reorder = false;  // complete each fetched batch of I/O commands in reverse order
};

enum class FaultAction {
  kStatus,          // complete with `status`, without executing
  kStall,           // never complete (until Abort, SQ deletion or reset)
  kDropCompletion,  // execute, post no completion
};

struct FaultRule {
  bool admin = false;  // match admin commands (else I/O commands)
  int opcode = -1;     // -1: any
  int64_t slba = -1;   // -1: any (I/O only)
  FaultAction action = FaultAction::kStatus;
  uint16_t status = kStatusInternalError;
  int times = 1;  // matches before the rule expires; -1: never expires
};

struct ModelCounters {
  uint64_t admin = 0;  // admin commands fetched
  uint64_t reads = 0;
  uint64_t writes = 0;
  uint64_t flushes = 0;
  uint64_t aborts = 0;  // Abort commands that aborted a command
  uint64_t resets = 0;  // CC.EN 1->0 transitions
  uint64_t faults = 0;  // fault rules applied
};

class ControllerModel final : public RegisterSpace, public DmaAllocator {
 public:
  // Starts the model's thread. INVALID_ARGUMENT for options out of the spec's ranges.
  static absl::StatusOr<std::unique_ptr<ControllerModel>> Create(const ModelOptions& options);
  // Stops the thread. Every buffer it allocated or mapped must be destroyed first.
  ~ControllerModel() override;

  // RegisterSpace. Writes to read-only registers are ignored.
  size_t size() const override { return reg_bytes_; }
  uint32_t Read32(size_t offset) const override;
  uint64_t Read64(size_t offset) const override;
  void Write32(size_t offset, uint32_t value) override;
  void Write64(size_t offset, uint64_t value) override;
  volatile uint32_t* DoorbellAddress(size_t offset) override;

  // DmaAllocator: host memory with fake IOVAs (never 0, a guard page between buffers).
  absl::StatusOr<std::unique_ptr<DmaBuffer>> Allocate(size_t size) override;
  absl::StatusOr<std::unique_ptr<DmaBuffer>> Map(uint8_t* memory, size_t size) override;

  void AddFault(const FaultRule& rule);
  void ClearFaults();
  // Sets CSTS.CFS; the model serves nothing more until the host resets it (CC.EN 1->0).
  void SetFatal();
  ModelCounters counters() const;
  uint8_t* namespace_data() { return media_.data(); }
  const ModelOptions& options() const { return options_; }

  // Translates [iova, iova + len) to host memory, or nullptr if it is not inside one buffer.
  uint8_t* Translate(uint64_t iova, uint64_t len) const;
  void Unregister(uint64_t iova);

 private:
  struct Sq {
    bool live = false;
    Sqe* ring = nullptr;
    uint32_t depth = 0;
    uint32_t head = 0;
    uint16_t cqid = 0;
  };
  struct Cq {
    bool live = false;
    Cqe* ring = nullptr;
    uint32_t depth = 0;
    uint32_t tail = 0;
    uint32_t phase = 1;
    std::vector<Cqe> backlog;  // completions waiting for room
  };
  struct Held {  // a stalled command
    uint16_t sqid;
    uint16_t cid;
  };
  struct Done {  // a completion to post
    uint16_t sqid;
    uint16_t cid;
    uint16_t status;
    uint32_t dw0;
  };
  struct Region {
    uint8_t* host;
    uint64_t size;
  };

  explicit ControllerModel(const ModelOptions& options);
  void Run();
  bool Step();
  void Enable();
  void Disable();
  void StepShutdown(uint32_t cc);
  bool ServeQueue(uint16_t sqid);
  void Serve(uint16_t sqid, const Sqe& e, std::vector<Done>* out);
  bool ApplyFault(uint16_t sqid, const Sqe& e, std::vector<Done>* out);
  Done Admin(uint16_t sqid, const Sqe& e);
  uint16_t CreateCq(const Sqe& e);
  uint16_t CreateSq(const Sqe& e);
  uint16_t DeleteSq(const Sqe& e);
  uint16_t DeleteCq(const Sqe& e);
  Done AbortCommand(uint16_t sqid, const Sqe& e);
  uint16_t ReadWrite(const Sqe& e);
  uint16_t Transfer(const Sqe& e, uint8_t* media, uint32_t len, bool to_host);
  uint16_t TransferPrp(const Sqe& e, uint8_t* media, uint32_t len, bool to_host);
  uint16_t TransferSgl(const Sqe& e, uint8_t* media, uint32_t len, bool to_host);
  void Identify(const Sqe& e, uint16_t* status);
  void Post(const Done& d);
  bool DrainBacklog(uint16_t cqid);
  uint32_t Reg(uint32_t offset) const;
  void SetReg(uint32_t offset, uint32_t value);

  const ModelOptions options_;
  const size_t reg_bytes_;
  uint32_t* regs_;  // reg_bytes_ / 4 words; accessed with __atomic builtins
  std::vector<uint8_t> media_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> fatal_{false};

  // Owned by the model's thread.
  bool enabled_ = false;
  int64_t enable_at_us_ = 0;
  int64_t shutdown_at_us_ = 0;
  bool vwc_enabled_ = true;
  std::vector<Sq> sqs_;
  std::vector<Cq> cqs_;
  std::vector<Held> held_;

  // Guards the four below. A std::mutex, not absl::Mutex: the Debian abseil is not built for
  // TSan, and this test model should be checkable under --config=tsan.
  mutable std::mutex mu_;
  std::map<uint64_t, Region> regions_;
  uint64_t next_iova_ = 0x100000000ull;
  std::vector<FaultRule> faults_;
  ModelCounters counters_;

  std::thread thread_;
};

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_MODEL_CONTROLLER_MODEL_H_
