#include "daemon/datapath/layer_reader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "daemon/pool/slot_header.h"

namespace tutti::datapath {
namespace {

// A Read keeps at least this many leases when it gives staging back to a waiting Read: one layer
// read while the other is handed to the engine (and, with staging_stays, held back until then).
constexpr uint32_t kMinLeases = 2;

uint64_t Nanos(std::chrono::steady_clock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}

uint64_t NowNanos() { return Nanos(std::chrono::steady_clock::now().time_since_epoch()); }

}  // namespace

// One layer's reads in flight: its plan, its requests, each planned object's outcome, and the
// count of batches and checks not done. Waits for them when destroyed, so staging outlives every
// read into it and every check of it.
struct LayerReader::InFlight {
  uint64_t stream = 0;  // the Read's (PostFn)
  uint32_t layer = 0;
  uint8_t* staging = nullptr;  // the lease's bytes
  LayerPlan plan;
  std::vector<io::IoRequest> reqs;
  // Per planned object, written by the batch that read it before `done` is notified: its outcome,
  // what the verifier checks, and the verifier's answer.
  std::vector<ReadFailure> object_failures;
  std::vector<ObjectCheck> checks;
  std::vector<uint8_t> matches;
  std::vector<const uint8_t*> device_copies;  // ObjectCheck::device_copy, per planned object
  std::vector<uint32_t> bounce_offsets;  // per request: its offset in its batch's bounce slot
  // Per batch, steady-clock nanoseconds, each written by the thread taking that step before the
  // batch finishes: asked for its bounce slot, posted (slot in hand), reads completed, bounce slot
  // given back (0 without one; `released` runs before `done`: verifier.h), answered.
  struct Clock {
    uint64_t asked = 0, posted = 0, read = 0, released = 0, answered = 0;
  };
  std::vector<Clock> clocks;
  // Batches posted whose reads or checks are not done.
  std::atomic<uint32_t> pending{0};
  std::unique_ptr<absl::Notification> done;
  void Finish(uint32_t n) {
    if (pending.fetch_sub(n, std::memory_order_acq_rel) == n) done->Notify();
  }
  void Wait() const {
    if (done != nullptr) done->WaitForNotification();
  }
  // After Wait: the batches' phases, summed, and those of the batch answered last (the one the
  // layer waited for; zeros for a layer with no batch).
  void Phases(BatchPhases* sum, BatchPhases* last) const {
    *sum = BatchPhases{};
    *last = BatchPhases{};
    uint64_t last_answered = 0;
    for (const Clock& c : clocks) {
      const BatchPhases p{1, c.posted - c.asked, c.read - c.posted, c.answered - c.read,
                          c.released == 0 ? 0 : c.released - c.read};
      *sum += p;
      if (c.answered >= last_answered) {
        last_answered = c.answered;
        *last = p;
      }
    }
  }
  ~InFlight() { Wait(); }
};

// The window's leases and layers in flight. Members are destroyed in reverse order: every read
// in flight has completed before its lease goes back.
struct LayerReader::Window {
  std::vector<StagingLease> leases;
  std::vector<InFlight> layers;
  uint32_t size() const { return static_cast<uint32_t>(layers.size()); }
};

LayerReader::LayerReader(const LayerReaderOptions& options, StagingPool* staging,
                         Verifier* verifier, PostFn post, BounceSlots* bounce)
    : options_(options),
      staging_(staging),
      verifier_(verifier),
      post_(std::move(post)),
      bounce_(bounce) {}

absl::Status LayerReader::TakeWindow(uint64_t layer_bytes, uint32_t layers, Window* window) {
  const uint32_t wanted = std::max<uint32_t>(1, std::min(layers, options_.window_layers));
  if (layer_bytes == 0) {  // every item from the DRAM tier, or failed: nothing to stage
    window->layers = std::vector<InFlight>(1);
    return absl::OkStatus();
  }
  if (layer_bytes > staging_->capacity_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "one layer of this read needs ", layer_bytes,
        " bytes of staging; limits.retrieve_staging_bytes holds ", staging_->capacity_bytes()));
  }
  std::optional<StagingLease> first = staging_->TryTake(layer_bytes);
  if (!first.has_value()) {
    counters_.AddStagingWait();
    absl::StatusOr<StagingLease> waited = staging_->Take(layer_bytes);
    if (!waited.ok()) return waited.status();
    first = std::move(*waited);
  }
  window->leases.push_back(std::move(*first));
  while (window->leases.size() < wanted) {
    std::optional<StagingLease> more = staging_->TryTake(layer_bytes);
    if (!more.has_value()) break;
    window->leases.push_back(std::move(*more));
  }
  window->layers = std::vector<InFlight>(window->leases.size());
  return absl::OkStatus();
}

void LayerReader::Post(const LayerReadRequest& r, uint32_t layer,
                       absl::Span<const ReadFailure> failures, const StagingLease& lease,
                       InFlight* in) {
  std::vector<PlanItem> items(r.items.size());
  for (size_t i = 0; i < r.items.size(); ++i) {
    if (r.items[i].from == ReadSource::From::kSsd && failures[i] == ReadFailure::kNone) {
      items[i].slot = r.items[i].slot;
    }
  }
  in->plan = PlanLayer(options_.layout,
                       PlanRequest{items, layer, r.parts, r.object_len, options_.max_read_bytes});
  in->layer = layer;
  in->staging = lease.data();
  in->object_failures.assign(in->plan.objects.size(), ReadFailure::kNone);
  in->checks.resize(in->plan.objects.size());
  in->matches.assign(in->plan.objects.size(), 0);
  in->device_copies.assign(in->plan.objects.size(), nullptr);
  in->reqs.clear();
  in->bounce_offsets.assign(in->plan.ios.size(), 0);
  uint64_t bytes = 0, merged = 0;
  for (const PlannedIo& io : in->plan.ios) {
    // With bounce slots the buffer is set when the batch gets its slot.
    uint8_t* buf = bounce_ == nullptr ? lease.data() + io.staging_offset : nullptr;
    in->reqs.push_back(io::IoRequest{io::Op::kRead, io.file, io.offset, buf, io.len, 0});
    bytes += io.len;
    merged += io.num_objects > 1;
  }
  counters_.AddLayer(in->reqs.size(), bytes, in->plan.objects.size(), merged);
  // Batches: runs of the plan's reads (sorted by file) of one file and at most post_bytes (and
  // what a bounce slot holds).
  const uint64_t limit = bounce_ == nullptr
                             ? options_.post_bytes
                             : std::min<uint64_t>(options_.post_bytes, bounce_->slot_bytes());
  std::vector<std::pair<uint32_t, uint32_t>> batches;
  for (uint32_t i = 0; i < in->reqs.size();) {
    uint32_t end = i + 1;
    uint64_t batch_bytes = in->reqs[i].len;
    while (end < in->reqs.size() && in->reqs[end].file == in->reqs[i].file &&
           batch_bytes + in->reqs[end].len <= limit) {
      in->bounce_offsets[end] = static_cast<uint32_t>(batch_bytes);
      batch_bytes += in->reqs[end].len;
      ++end;
    }
    batches.emplace_back(i, end);
    i = end;
  }
  in->clocks.assign(batches.size(), InFlight::Clock{});
  in->done = std::make_unique<absl::Notification>();
  if (batches.empty()) {
    in->done->Notify();
    return;
  }
  // Every batch is counted before the first is posted: one may complete at once.
  in->pending.store(static_cast<uint32_t>(batches.size()), std::memory_order_relaxed);
  for (uint32_t b = 0; b < batches.size(); ++b) {
    const auto [begin, end] = batches[b];
    in->clocks[b].asked = NowNanos();
    if (bounce_ == nullptr) {
      PostBatch(r, in, b, begin, end, nullptr);
    } else {
      bounce_->Acquire(in->reqs[begin].file, in->stream,
                       [this, &r, in, b, begin = begin, end = end](uint8_t* slot) {
                         PostBatch(r, in, b, begin, end, slot);
                       });
    }
  }
}

void LayerReader::PostBatch(const LayerReadRequest& r, InFlight* in, uint32_t batch, uint32_t begin,
                            uint32_t end, uint8_t* slot) {
  if (slot != nullptr) {
    for (uint32_t i = begin; i < end; ++i) in->reqs[i].buf = slot + in->bounce_offsets[i];
  }
  in->clocks[batch].posted = NowNanos();
  post_(in->stream, absl::MakeSpan(in->reqs).subspan(begin, end - begin),
        [this, &r, in, batch, begin, end, slot] { OnReadsDone(r, in, batch, begin, end, slot); });
}

void LayerReader::OnReadsDone(const LayerReadRequest& r, InFlight* in, uint32_t batch,
                              uint32_t begin, uint32_t end, uint8_t* slot) {
  in->clocks[batch].read = NowNanos();
  const uint32_t first = in->plan.ios[begin].first_object;
  const uint32_t last = in->plan.ios[end - 1].first_object + in->plan.ios[end - 1].num_objects;
  for (uint32_t k = first; k < last; ++k) {
    const PlannedObject& o = in->plan.objects[k];
    const ReadSource& src = r.items[o.item];
    const uint32_t object = in->layer * r.parts + o.part;
    in->object_failures[k] = ReadOutcome(*in, o);
    // A failed read's object is not hashed (len 0); its outcome stands.
    const uint32_t len = in->object_failures[k] == ReadFailure::kNone ? r.object_len : 0;
    // With a bounce slot the bytes are in the slot, at the object's offset in its read, and are
    // placed at the object's offset in the layer's (GPU) lease.
    const PlannedIo& io = in->plan.ios[o.io];
    uint8_t* const bytes = slot != nullptr ? slot + in->bounce_offsets[o.io] +
                                                 (o.staging_offset - io.staging_offset)
                                           : in->staging + o.staging_offset;
    uint8_t* const place = slot != nullptr ? in->staging + o.staging_offset : nullptr;
    in->checks[k] = ObjectCheck{r.ns, &src.key, src.epoch, object, bytes, len,
                                src.checksums[object], &in->device_copies[k], place};
  }
  auto answered = [in, batch, first, last, slot] {
    for (uint32_t k = first; k < last; ++k) {
      if (in->object_failures[k] != ReadFailure::kNone) continue;
      if (in->matches[k] == kMismatch) {
        in->object_failures[k] = ReadFailure::kChecksum;
      } else if (in->matches[k] != kMatch ||  // kNotChecked: neither served nor blamed
                 (slot != nullptr && in->device_copies[k] == nullptr)) {
        in->object_failures[k] = ReadFailure::kNotPlaced;
      }
    }
    in->clocks[batch].answered = NowNanos();
    in->Finish(1);
  };
  const auto checks = absl::MakeConstSpan(in->checks).subspan(first, last - first);
  const auto matches = absl::MakeSpan(in->matches).subspan(first, last - first);
  if (slot == nullptr) {
    verifier_->Verify(in->stream, checks, matches, std::move(answered));
    return;
  }
  // The bounce slot goes back as soon as the verifier no longer reads it (the GPU's: once the
  // objects are copied to their places), so the device's next reads need not wait for the checks.
  const uint32_t file = in->reqs[begin].file;
  verifier_->VerifyReleasing(
      in->stream, checks, matches,
      [this, in, batch, file, slot] {
        in->clocks[batch].released = NowNanos();
        bounce_->Release(file, slot);
      },
      std::move(answered));
}

ReadFailure LayerReader::ReadOutcome(const InFlight& in, const PlannedObject& o) {
  const io::IoRequest& req = in.reqs[o.io];
  const uint64_t end_in_io = o.staging_offset - in.plan.ios[o.io].staging_offset + in.plan.read_len;
  if (req.result < 0) return ReadFailure::kIoError;
  if (static_cast<uint64_t>(req.result) < end_in_io) return ReadFailure::kShortRead;
  return ReadFailure::kNone;
}

void LayerReader::Collect(const LayerReadRequest& r, uint32_t layer, const InFlight& in,
                          const StagingLease& lease, std::vector<ReadFailure>* failures,
                          std::vector<engine::CopyOp>* ops, std::vector<uint32_t>* failed,
                          bool* from_staging) const {
  for (uint32_t i = 0; i < r.items.size(); ++i) {
    const ReadSource& src = r.items[i];
    const uint32_t block = r.engine_blocks.empty() ? i : r.engine_blocks[i];
    if (src.from == ReadSource::From::kFailed && layer == r.layer_begin) failed->push_back(i);
    if ((*failures)[i] != ReadFailure::kNone) continue;
    const size_t ops_before = ops->size();
    for (uint32_t p = 0; p < r.parts; ++p) {
      const uint32_t object = layer * r.parts + p;
      if (src.from == ReadSource::From::kDram) {
        ops->push_back(engine::CopyOp{block, object, src.dram + uint64_t{object} * r.object_len});
        continue;
      }
      const uint32_t index = in.plan.object_of[i * r.parts + p];
      if (index == kNoObject) {  // not planned: cannot happen for an item not failed
        (*failures)[i] = ReadFailure::kIoError;
        break;
      }
      if (in.object_failures[index] != ReadFailure::kNone) {
        (*failures)[i] = in.object_failures[index];
        break;
      }
      ops->push_back(engine::CopyOp{block, object,
                                    lease.data() + in.plan.objects[index].staging_offset,
                                    in.device_copies[index]});
    }
    if ((*failures)[i] != ReadFailure::kNone) {
      ops->resize(ops_before);
      failed->push_back(i);
    } else if (src.from == ReadSource::From::kSsd) {
      *from_staging = true;
    }
  }
}

LayerReadResult LayerReader::Read(const LayerReadRequest& r, const Sink& sink) {
  const auto entered = std::chrono::steady_clock::now();
  LayerReadResult result = ReadLayers(r, sink);
  counters_.AddCall(Nanos(std::chrono::steady_clock::now() - entered));
  return result;
}

LayerReadResult LayerReader::ReadLayers(const LayerReadRequest& r, const Sink& sink) {
  LayerReadResult result;
  result.failures.assign(r.items.size(), ReadFailure::kNone);
  uint64_t ssd_objects = 0;
  for (size_t i = 0; i < r.items.size(); ++i) {
    if (r.items[i].from == ReadSource::From::kFailed) result.failures[i] = ReadFailure::kBeforeRead;
    if (r.items[i].from == ReadSource::From::kSsd) ssd_objects += r.parts;
  }
  const uint64_t layer_bytes = ssd_objects * RoundUp4K(r.object_len);
  const auto entered = std::chrono::steady_clock::now();
  Window window;
  result.status = TakeWindow(layer_bytes, r.layer_end - r.layer_begin, &window);
  if (!result.status.ok()) return result;
  const uint64_t stream = next_stream_.fetch_add(1, std::memory_order_relaxed);
  for (InFlight& in : window.layers) in.stream = stream;
  const auto started = std::chrono::steady_clock::now();
  // This Read's own split, for its debug line: waits for layers (the first, the longest), sinks.
  uint64_t wait_ns = 0, first_wait_ns = 0, longest_wait_ns = 0, sink_ns = 0, post_ns = 0;
  BatchPhases phases, first_last;  // every batch's; the first layer's batch answered last
  static const StagingLease kNoLease;
  auto lease_at = [&](uint32_t slot) -> const StagingLease& {
    return window.leases.empty() ? kNoLease : window.leases[slot];
  };
  // With three leases or more (or one per layer of the read), a layer's staging stays untouched
  // until the sink's next call has returned (the sink may leave its engine copy in flight until
  // then): the lease of layer l - 1 is posted into again once sink(l) returns. With fewer, a lease
  // is reused once its layer's sink call returns: holding one of two back would leave a single
  // layer of reads in flight.
  const bool staging_stays =
      window.leases.size() >= std::min<uint32_t>(3, r.layer_end - r.layer_begin);
  // The window's slots (a layer in flight and its lease): free to post into, and posted, by layer.
  std::deque<uint32_t> free_slots, posted;
  for (uint32_t i = 0; i < window.size(); ++i) free_slots.push_back(i);
  uint32_t leases_held = static_cast<uint32_t>(window.leases.size());
  // A slot whose layer is done goes back to the window; or, while another Read waits for staging,
  // its lease goes back to the pool (down to kMinLeases), so that Read starts now instead of once
  // this one ends.
  auto slot_done = [&](uint32_t slot) {
    if (leases_held > kMinLeases && staging_->HasWaiters()) {
      window.leases[slot].Release();
      --leases_held;
      counters_.AddStagingYield();
      return;
    }
    free_slots.push_back(slot);
  };
  uint32_t next_post = r.layer_begin;
  auto post_free = [&] {
    const auto from = std::chrono::steady_clock::now();
    for (; next_post < r.layer_end && !free_slots.empty(); ++next_post) {
      const uint32_t slot = free_slots.front();
      free_slots.pop_front();
      Post(r, next_post, result.failures, lease_at(slot), &window.layers[slot]);
      posted.push_back(slot);
    }
    const uint64_t ns = Nanos(std::chrono::steady_clock::now() - from);
    post_ns += ns;
    counters_.AddPost(ns);
  };
  post_free();
  std::vector<engine::CopyOp> ops;
  std::vector<uint32_t> failed;
  std::optional<uint32_t> held_back;  // the slot of the layer sunk last, with staging_stays
  for (uint32_t layer = r.layer_begin; layer < r.layer_end && result.status.ok(); ++layer) {
    const uint32_t slot = posted.front();
    posted.pop_front();
    InFlight& in = window.layers[slot];
    const auto wait_from = std::chrono::steady_clock::now();
    in.Wait();
    const auto sink_from = std::chrono::steady_clock::now();
    BatchPhases layer_phases, last;
    in.Phases(&layer_phases, &last);
    counters_.AddBatches(layer_phases);
    phases += layer_phases;
    if (layer == r.layer_begin) first_last = last;
    ops.clear();
    failed.clear();
    bool from_staging = false;
    Collect(r, layer, in, lease_at(slot), &result.failures, &ops, &failed, &from_staging);
    result.status = sink(LayerObjects{layer, ops, failed, !from_staging || staging_stays});
    ++result.layers_done;
    const uint64_t waited = Nanos(sink_from - wait_from);
    const uint64_t sunk = Nanos(std::chrono::steady_clock::now() - sink_from);
    counters_.AddLead(waited, sunk);
    if (layer == r.layer_begin) first_wait_ns = waited;
    wait_ns += waited;
    longest_wait_ns = std::max(longest_wait_ns, waited);
    sink_ns += sunk;
    if (!staging_stays) {
      slot_done(slot);
    } else {
      if (held_back.has_value()) slot_done(*held_back);
      held_back = slot;
    }
    post_free();
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  static const std::shared_ptr<spdlog::logger> logger = log::Get("datapath");
  if (logger->should_log(spdlog::level::debug)) {
    constexpr double kMs = 1e-6;
    const double per_batch = phases.batches == 0 ? 0 : kMs / phases.batches;
    logger->debug(
        "read {}: {} items, {} of {} layers of {} KiB in {:.2f} ms: staging {:.2f} ms ({} "
        "leases), posting {:.2f}, waiting {:.2f} (first layer {:.2f}, longest {:.2f}), sink "
        "{:.2f}; {} batches, each on average: slot {:.2f} ms, reads {:.2f}, checks {:.2f} (slot "
        "back after {:.2f}); the first layer's last: slot {:.2f}, reads {:.2f}, checks {:.2f}",
        stream, r.items.size(), result.layers_done, r.layer_end - r.layer_begin, layer_bytes >> 10,
        1e3 * result.seconds, kMs * Nanos(started - entered), window.leases.size(), kMs * post_ns,
        kMs * wait_ns, kMs * first_wait_ns, kMs * longest_wait_ns, kMs * sink_ns, phases.batches,
        per_batch * phases.slot_ns, per_batch * phases.io_ns, per_batch * phases.check_ns,
        per_batch * phases.release_ns, kMs * first_last.slot_ns, kMs * first_last.io_ns,
        kMs * first_last.check_ns);
  }
  return result;  // `window` waits for reads still in flight, then gives its leases back
}

}  // namespace tutti::datapath
