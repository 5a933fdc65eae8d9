// The part both io_uring backends ("uring", uring_backend.h; "uring_cmd", uring_cmd_backend.h)
// share: one ring, the one fd registered with it, and the one thread that owns both.
//
// One owner per ring (STYLE.md rule 5): after Create, only the owner thread touches the ring, the
// queued and in-flight items, and calls the backend's UringItemOps; other threads hand it work by
// message (Post, RegisterBuffer, UnregisterBuffer, through an OwnerMailbox). Debug builds assert
// it (OnOwnerThread).
//
// The owner's loop: take what was posted (an empty part finishes at once), prepare SQEs for queued
// items in arrival order while fewer than `depth` are in flight (IssueQueue; the only exception is
// a backend's cap on reads in flight, UringItemOps::ReadsMayGo, see issue_queue.h), submit
// everything prepared and wait for a completion with one io_uring_enter, reap every completion
// there is. Work posted while the owner waits in the kernel with only writes in flight wakes it
// at once (UringRing::Wake): a read posted behind a long write starts now, not when the write
// completes. With a read in flight the next completion is near, and the work waits for it, as
// posts that arrive together then go in one submission (waking for each cost tmpfs:8 retrieves
// 7% on the H100 machine, docs/gpu.md). What differs between the backends is in UringItemOps: how
// an item's SQE is prepared and what its completion means (done, or to be issued again first).
//
// Batches: a Submit is one UringBatch, split in UringParts, one per ring it touches; a part counts
// its requests, the batch its parts, and the batch's `done` runs (on the owner thread that
// finished the last part) after which the batch is deleted.
//
// Private to daemon/io.
#ifndef TUTTI_DAEMON_IO_URING_OWNER_H_
#define TUTTI_DAEMON_IO_URING_OWNER_H_

#include <liburing.h>
#include <pthread.h>

#include <atomic>
#include <cassert>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/io/io_backend.h"
#include "daemon/io/issue_queue.h"
#include "daemon/io/owner_mailbox.h"

namespace tutti::io::internal {

// One Submit: `done` runs when the last of its parts finishes. Allocated with new by Submit and
// deleted by FinishPart; a backend may derive from it to keep per-request state with the batch.
struct UringBatch;
struct UringPart {
  UringBatch* batch = nullptr;
  uint32_t left = 0;  // requests of this part not completed yet; owner thread only
};
struct UringBatch {
  virtual ~UringBatch() = default;
  std::function<void()> done;
  std::atomic<uint32_t> parts_left{0};
  absl::InlinedVector<UringPart, 4> parts;  // never reallocated once a part is posted
};

// Counts `part` finished; the last part of a batch runs its `done` and deletes the batch.
void FinishPart(UringPart* part);
// Counts one request of `part` completed; finishes the part with its last request.
void FinishRequest(UringPart* part);

struct UringOwnerOptions {
  std::string name;              // names the ring in messages: "pool file 3", "/dev/ng0n1"
  std::string thread_name;       // the owner thread's name (15 bytes at most); "" keeps none
  uint32_t depth = 64;           // items in flight at most, and the ring's size
  uint32_t setup_flags = 0;      // io_uring_setup flags (IORING_SETUP_SQE128 | ...)
  std::string setup_flags_text;  // how messages show setup_flags, e.g. "SQE128 | CQE32"
  std::string setup_hint;        // why io_uring_queue_init may fail here, for its message
  std::string memlock_per;       // "pool file", "namespace": what RLIMIT_MEMLOCK is charged per
  // Runs on the set-up ring before the owner thread starts (e.g. an opcode probe); an error
  // fails Create with it.
  std::function<absl::Status(io_uring* ring)> check_ring;
};

// The ring itself: set-up, the registered fd and buffer, submission and reaping. Owner thread only
// after Create, except fd().
class UringRing {
 public:
  // Sets up the ring (options.depth entries, options.setup_flags), runs options.check_ring and
  // registers `fd` with it (a plain fd is used when that fails, with a warning). Takes `fd` in
  // every case: closed on error and by the destructor. UNAVAILABLE with options.setup_hint when
  // io_uring_queue_init fails; check_ring's error as it comes.
  static absl::StatusOr<std::unique_ptr<UringRing>> Create(int fd,
                                                           const UringOwnerOptions& options);
  // Unregisters the fd and the buffer (so the file and its locks are released now, not when the
  // kernel's asynchronous teardown gets to it), exits the ring, closes the fd.
  ~UringRing();

  int fd() const { return fd_; }
  // What an SQE names as its file: index 0 of the registered files, or the plain fd.
  int target() const { return fixed_file_ ? 0 : fd_; }
  bool fixed_file() const { return fixed_file_; }
  io_uring* ring() { return &ring_; }

  // Registers `region` in pieces of `piece` bytes (the last may be shorter). RESOURCE_EXHAUSTED
  // when the kernel refuses to pin it (RLIMIT_MEMLOCK, charged per options.memlock_per), INTERNAL
  // otherwise; nothing is registered after an error.
  [[nodiscard]] absl::Status RegisterBuffer(absl::Span<uint8_t> region, uint64_t piece);
  void UnregisterBuffer();
  // The registered piece holding all of [buf, buf + len), or -1 (outside, or straddling two).
  int FixedIndex(const uint8_t* buf, uint32_t len) const;

  // Submits what was prepared and waits for one completion; `in_flight` is counted. With
  // `wakeable`, Wake ends the wait too, and `posted` is asked after the owner is marked waiting:
  // when it says work was posted meanwhile, the call submits without waiting, so no Wake is missed
  // between the owner's last look and its wait. Retried next round on EINTR / EAGAIN / EBUSY; other
  // errors are logged (rate-limited) and slept off (1 ms).
  void SubmitAndWait(uint32_t in_flight, bool wakeable, absl::FunctionRef<bool()> posted);
  // Calls `complete(user_data, res)` for every completion there is but Wake's, then marks them
  // seen.
  void Reap(absl::FunctionRef<void(uint64_t, int)> complete);
  // Any thread, after posting work for the owner: ends its wait in SubmitAndWait if it is in one
  // (one eventfd write; nothing when the owner is not waiting in the kernel).
  void Wake();
  // Wakes that ended a wait, since creation (any thread; approximate while running).
  uint64_t wakes() const { return wakes_.load(std::memory_order_relaxed); }

  uint64_t enter_calls() const { return enter_calls_.load(std::memory_order_relaxed); }
  uint64_t in_flight_sum() const { return in_flight_sum_.load(std::memory_order_relaxed); }

 private:
  UringRing(int fd, std::string name, std::string memlock_per)
      : fd_(fd), name_(std::move(name)), memlock_per_(std::move(memlock_per)) {}
  // Owner: keeps a read of the wake eventfd in the ring (prepared, submitted with the next enter).
  void ArmWake();

  const int fd_;
  int wake_fd_ = -1;  // eventfd: Wake writes, the armed read completes and ends the wait
  const std::string name_;
  const std::string memlock_per_;
  io_uring ring_{};
  bool fixed_file_ = false;
  const uint8_t* fixed_base_ = nullptr;
  uint64_t fixed_len_ = 0;
  uint64_t piece_ = 0;
  std::atomic<uint64_t> enter_calls_{0}, in_flight_sum_{0}, wakes_{0};
  std::atomic<bool> waiting_{false};  // the owner is in (or about to enter) its wait
  bool wake_armed_ = false;           // owner: the eventfd read is in the ring
  bool wake_broken_ = false;          // owner: the read failed; waits are plain from then on
  uint64_t wake_buf_ = 0;             // where the armed read puts the eventfd's count
};

// What a backend does with its items; called on the owner thread only.
template <typename Item>
class UringItemOps {
 public:
  virtual ~UringItemOps() = default;
  // Whether a read may be issued now (a backend's cap on reads in flight); writes always may.
  virtual bool ReadsMayGo() const { return true; }
  // Fills `sqe` for `item` (the owner sets IOSQE_FIXED_FILE and user_data after). `target` is
  // the file the SQE names (UringRing::target). `item` is the in-flight copy Complete gets.
  virtual void Prepare(io_uring_sqe* sqe, Item& item, int target) = 0;
  // `item` completed with `res` (the CQE's). Returns true to issue it again before everything
  // queued (a retry), false when the backend is done with it.
  virtual bool Complete(Item& item, int res) = 0;
};

// One ring and its owner thread, issuing `Item`s. Item is copyable and default-constructible,
// with a member `UringPart* part`, `bool empty() const` (true for a default-constructed Item: an
// empty part's marker) and `Op op() const`.
template <typename Item>
class UringOwner {
 public:
  // Sets up the ring (UringRing::Create, which takes `fd` in every case) and starts the owner
  // thread. `ops` must outlive the owner.
  static absl::StatusOr<std::unique_ptr<UringOwner>> Create(int fd,
                                                            const UringOwnerOptions& options,
                                                            UringItemOps<Item>* ops) {
    absl::StatusOr<std::unique_ptr<UringRing>> ring = UringRing::Create(fd, options);
    if (!ring.ok()) return ring.status();
    std::unique_ptr<UringOwner> o(new UringOwner(*std::move(ring), options.depth, ops));
    o->thread_ = std::thread([p = o.get()] { p->Run(); });
    if (!options.thread_name.empty()) {
      pthread_setname_np(o->thread_.native_handle(), options.thread_name.c_str());
    }
    return o;
  }
  // Finishes everything posted (every part's batch completes), stops the thread, then the ring.
  ~UringOwner() {
    mailbox_.Stop();
    if (thread_.joinable()) thread_.join();
  }

  int fd() const { return ring_->fd(); }
  uint64_t enter_calls() const { return ring_->enter_calls(); }
  uint64_t in_flight_sum() const { return ring_->in_flight_sum(); }
  uint64_t wakes() const { return ring_->wakes(); }

  // Any thread: queues `items` (in order, each of them already naming `part`). An empty `items`
  // queues the part itself, which the owner finishes as soon as it takes it.
  void Post(UringPart* part, std::vector<Item> items) {
    if (!items.empty()) {
      mailbox_.Post(std::move(items));
      return;
    }
    Item marker;
    marker.part = part;
    mailbox_.PostOne(std::move(marker));
  }
  // Any thread but the owner: UringRing::RegisterBuffer / UnregisterBuffer on the owner thread,
  // between I/O rounds (io_uring wants them from the ring's submitter).
  [[nodiscard]] absl::Status RegisterBuffer(absl::Span<uint8_t> region, uint64_t piece) {
    return mailbox_.RunOnOwner(
        [this, region, piece] { return ring_->RegisterBuffer(region, piece); });
  }
  void UnregisterBuffer() {
    mailbox_
        .RunOnOwner([this] {
          ring_->UnregisterBuffer();
          return absl::OkStatus();
        })
        .IgnoreError();
  }
  // Owner thread (from UringItemOps): the registered piece holding [buf, buf + len), or -1.
  int FixedIndex(const uint8_t* buf, uint32_t len) const {
    assert(OnOwnerThread());
    return ring_->FixedIndex(buf, len);
  }

 private:
  UringOwner(std::unique_ptr<UringRing> ring, uint32_t depth, UringItemOps<Item>* ops)
      : ring_(std::move(ring)),
        depth_(depth),
        ops_(ops),
        mailbox_([r = ring_.get()] { r->Wake(); }),  // ring_ is declared, so built, before it
        slots_(depth) {
    for (uint32_t i = depth; i > 0; --i) free_slots_.push_back(i - 1);
  }
  bool OnOwnerThread() const { return std::this_thread::get_id() == owner_; }

  void Run() {
    owner_ = std::this_thread::get_id();
    for (;;) {
      if (!TakeIncoming(/*block=*/in_flight_ == 0 && queued_.empty())) return;
      PrepareSqes();
      if (in_flight_ == 0) continue;
      ring_->SubmitAndWait(in_flight_, /*wakeable=*/reads_in_flight_ == 0,
                           [this] { return mailbox_.HasPosts(); });
      ring_->Reap([this](uint64_t slot, int res) { Complete(slot, res); });
    }
  }

  // Moves posted work to the queue (running control tasks); blocks for some when `block`.
  // Returns false when stopping with nothing left to do.
  bool TakeIncoming(bool block) {
    typename OwnerMailbox<Item>::Taken taken = mailbox_.Take(block);
    for (const Item& item : taken.items) {
      if (item.empty()) {
        FinishPart(item.part);
      } else {
        queued_.Push(item, item.op());
      }
    }
    const bool idle = in_flight_ == 0 && queued_.empty();
    return !(taken.stopping && idle && taken.items.empty() && !taken.ran_control);
  }

  void PrepareSqes() {
    assert(OnOwnerThread());
    while (in_flight_ < depth_ && !queued_.empty()) {
      const bool reads_may_go = ops_->ReadsMayGo();
      if (!reads_may_go && !queued_.has_writes()) break;
      io_uring_sqe* sqe = io_uring_get_sqe(ring_->ring());
      if (sqe == nullptr) break;  // cannot happen with in_flight_ < depth_; stay safe
      const uint32_t slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot] = *queued_.Pop(reads_may_go);
      ++in_flight_;
      if (slots_[slot].op() == Op::kRead) ++reads_in_flight_;
      ops_->Prepare(sqe, slots_[slot], ring_->target());
      if (ring_->fixed_file()) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, slot);
    }
  }

  void Complete(uint64_t slot, int res) {
    assert(OnOwnerThread());
    Item item = slots_[slot];
    free_slots_.push_back(static_cast<uint32_t>(slot));
    --in_flight_;
    if (item.op() == Op::kRead) --reads_in_flight_;
    if (ops_->Complete(item, res)) queued_.PushFront(item, item.op());
  }

  const std::unique_ptr<UringRing> ring_;
  const uint32_t depth_;
  UringItemOps<Item>* const ops_;
  OwnerMailbox<Item> mailbox_;

  // Owner-thread state.
  IssueQueue<Item> queued_;  // taken from the mailbox, not yet issued
  std::vector<Item> slots_;  // in flight, by user_data
  std::vector<uint32_t> free_slots_;
  uint32_t in_flight_ = 0;
  uint32_t reads_in_flight_ = 0;  // of in_flight_
  std::thread::id owner_;

  std::thread thread_;
};

}  // namespace tutti::io::internal

#endif  // TUTTI_DAEMON_IO_URING_OWNER_H_
