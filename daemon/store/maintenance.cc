// BlockStore's operator maintenance: the scrub (every block's header and objects read back and
// checked, bad ones dropped) and a flush with a deadline (tuttictl verify and drain).
//
// The scrub reads as Reads do: objects through datapath::LayerReader (the I/O scheduler's read
// class, verified against the index's checksums), headers through the same scheduler, one modest
// batch at a time, so engines' reads are queued beside it, never behind a whole-pool sweep. Bad
// blocks leave the index by RetireFailedBlocks, the path a failed Read takes.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/align.h"
#include "common/log.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/pool/slot_header.h"
#include "daemon/store/block_store_impl.h"

namespace tutti::store {

struct BlockStore::Impl::ScrubTarget {
  NamespaceId ns = 0;
  Key key;
  uint64_t epoch = 0;
};

namespace {

const char* FailureReason(datapath::ReadFailure f) {
  switch (f) {
    case datapath::ReadFailure::kChecksum:
      return "object checksum mismatch";
    case datapath::ReadFailure::kIoError:
      return "I/O error";
    case datapath::ReadFailure::kShortRead:
      return "short read";
    default:
      return "";
  }
}

// Why `h` does not describe the block of `src` ("" if it does).
std::string HeaderMismatch(const pool::SlotHeader& h, NamespaceId ns, const NamespaceInfo& info,
                           const datapath::ReadSource& src) {
  if (h.ns != ns || !(h.key == src.key)) return "slot header names another block";
  if (h.epoch != src.epoch) {
    return absl::StrCat("slot header has epoch ", h.epoch, ", the index ", src.epoch);
  }
  if (h.object_len != info.object_len || h.checksums.size() != src.checksums.size()) {
    return "slot header's object length or count differs from the index";
  }
  if (!std::equal(h.checksums.begin(), h.checksums.end(), src.checksums.begin())) {
    return "slot header's checksums differ from the index";
  }
  return "";
}

}  // namespace

bool BlockStore::Impl::FlushFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return write_queue_.empty() && writing_ == 0;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

std::vector<std::string> BlockStore::Impl::CheckHeaders(
    NamespaceId ns, const NamespaceInfo& info, absl::Span<const datapath::ReadSource> sources) {
  std::vector<std::string> reasons(sources.size());
  io::AlignedBuffer buf(sources.size() * pool::kSlotHeaderBytes);
  std::vector<io::IoRequest> reqs;
  std::vector<size_t> of;  // reqs[i] reads the header of sources[of[i]]
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].from != datapath::ReadSource::From::kSsd) continue;
    const pool::Location loc = options_.layout.HeaderLocation(sources[i].slot);
    reqs.push_back(io::IoRequest{io::Op::kRead, loc.file, loc.offset,
                                 buf.data() + i * pool::kSlotHeaderBytes,
                                 static_cast<uint32_t>(pool::kSlotHeaderBytes), 0});
    of.push_back(i);
  }
  if (reqs.empty()) return reasons;
  absl::Notification done;
  scheduler_->Post(datapath::IoClass::kRead, absl::MakeSpan(reqs), [&done] { done.Notify(); });
  done.WaitForNotification();
  for (size_t r = 0; r < reqs.size(); ++r) {
    std::string& reason = reasons[of[r]];
    if (reqs[r].result < 0) {
      reason = absl::StrCat("slot header: I/O error (", strerror(static_cast<int>(-reqs[r].result)),
                            ")");
      continue;
    }
    if (reqs[r].result != reqs[r].len) {
      reason = "slot header: short read";
      continue;
    }
    auto header = pool::DecodeSlotHeader(
        absl::MakeConstSpan(buf.data() + of[r] * pool::kSlotHeaderBytes,
                            static_cast<size_t>(pool::kSlotHeaderBytes)));
    reason = header.ok() ? HeaderMismatch(*header, ns, info, sources[of[r]])
                         : absl::StrCat("slot header: ", header.status().message());
  }
  return reasons;
}

absl::Status BlockStore::Impl::ScrubBatch(NamespaceId ns, absl::Span<const ScrubTarget> batch,
                                          ScrubProgress* progress) {
  progress->blocks_checked += batch.size();
  auto described = GetNamespace(ns);
  if (!described.ok()) return absl::OkStatus();  // no block of it is left to check
  const NamespaceInfo& info = *described;
  std::vector<Key> pinned;
  std::vector<datapath::ReadSource> sources;
  std::vector<std::string> reasons;
  {
    absl::MutexLock lock(&mu_);
    for (const ScrubTarget& t : batch) {
      Entry* e = index_.Find(ns, t.key);
      if (e == nullptr || e->epoch != t.epoch) continue;  // evicted or replaced meanwhile
      ++e->pins;  // held until the end of the batch: its slot and checksums stay
      pinned.push_back(t.key);
      datapath::ReadSource src;
      src.key = t.key;
      src.slot = e->slot;
      src.epoch = e->epoch;
      src.checksums = index_.Checksums(*e);
      const bool fits = e->num_objects == info.num_objects && e->object_len == info.object_len;
      src.from = fits ? datapath::ReadSource::From::kSsd : datapath::ReadSource::From::kFailed;
      reasons.push_back(fits ? "" : "index entry does not fit its namespace");
      sources.push_back(src);
    }
  }
  if (pinned.empty()) return absl::OkStatus();
  const std::vector<std::string> header_reasons = CheckHeaders(ns, info, sources);
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].from != datapath::ReadSource::From::kSsd) continue;
    progress->bytes_read += pool::kSlotHeaderBytes;
    if (header_reasons[i].empty()) continue;
    reasons[i] = header_reasons[i];
    sources[i].from = datapath::ReadSource::From::kFailed;  // its objects are not read
  }
  const uint32_t layers = info.num_objects / info.parts;
  const datapath::LayerReadResult result = reader_->Read(
      datapath::LayerReadRequest{ns, sources, 0, layers, info.parts, info.object_len},
      [](const datapath::LayerObjects&) { return absl::OkStatus(); });
  std::vector<FailedBlock> failed;
  uint64_t verify_errors = 0, io_errors = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const datapath::ReadFailure f =
        result.layers_done == 0 ? datapath::ReadFailure::kNone : result.failures[i];
    if (f == datapath::ReadFailure::kNone && sources[i].from == datapath::ReadSource::From::kSsd) {
      progress->bytes_read += uint64_t{info.num_objects} * info.object_len;
    }
    if (reasons[i].empty()) reasons[i] = FailureReason(f);
    if (reasons[i].empty()) continue;
    const bool io = f == datapath::ReadFailure::kIoError || f == datapath::ReadFailure::kShortRead ||
                    absl::StartsWith(reasons[i], "slot header: I/O") ||
                    reasons[i] == "slot header: short read";
    io ? ++io_errors : ++verify_errors;
    failed.push_back(FailedBlock{sources[i].key, sources[i].epoch});
    progress->bad.push_back(ScrubBadBlock{ns, sources[i].key, sources[i].slot, reasons[i]});
    log::Get("store")->error("verify: namespace {:016x} block {} slot {}: {}; dropped from the index",
                             ns, sources[i].key.Hex(), sources[i].slot, reasons[i]);
  }
  progress->blocks_bad += failed.size();
  RetireFailedBlocks(ns, failed);
  Unpin(ns, pinned);
  {
    absl::MutexLock lock(&mu_);
    stats_.verify_errors += verify_errors;
    stats_.io_errors += io_errors;
  }
  return result.layers_done == 0 && !result.status.ok() ? result.status : absl::OkStatus();
}

absl::StatusOr<ScrubProgress> BlockStore::Impl::Scrub(const ScrubOptions& options,
                                                      const ScrubCallback& progress) {
  std::vector<ScrubTarget> targets;
  {
    absl::MutexLock lock(&mu_);
    index_.ForEach([&targets](const Entry* e) {
      targets.push_back(ScrubTarget{e->ns, e->key, e->epoch});
    });
  }
  // By namespace, and by slot order within it is not needed: the reader merges what is adjacent.
  std::stable_sort(targets.begin(), targets.end(),
                   [](const ScrubTarget& a, const ScrubTarget& b) { return a.ns < b.ns; });
  ScrubProgress total;
  total.blocks_total = targets.size();
  size_t i = 0;
  while (i < targets.size()) {
    const NamespaceId ns = targets[i].ns;
    size_t n = std::max<uint32_t>(1, options.batch_blocks);
    if (auto info = GetNamespace(ns); info.ok()) {
      const uint64_t layer_bytes = uint64_t{info->parts} * RoundUp4K(info->object_len);
      n = std::max<uint64_t>(1, std::min<uint64_t>(n, options_.retrieve_staging_bytes / layer_bytes));
    }
    size_t end = i;
    while (end < targets.size() && end - i < n && targets[end].ns == ns) ++end;
    ScrubProgress batch;
    const absl::Status s =
        ScrubBatch(ns, absl::MakeConstSpan(targets).subspan(i, end - i), &batch);
    if (!s.ok()) return s;
    i = end;
    total.blocks_checked += batch.blocks_checked;
    total.blocks_bad += batch.blocks_bad;
    total.bytes_read += batch.bytes_read;
    total.bad.insert(total.bad.end(), batch.bad.begin(), batch.bad.end());
    if (progress) {
      ScrubProgress report = total;
      report.bad = std::move(batch.bad);
      if (!progress(report)) {
        return absl::CancelledError(absl::StrCat("verify stopped after ", total.blocks_checked,
                                                 " of ", total.blocks_total, " blocks"));
      }
    }
  }
  log::Get("store")->info("verify: {} blocks checked, {} bad and dropped, {} bytes read",
                          total.blocks_checked, total.blocks_bad, total.bytes_read);
  return total;
}

// --- the public face ---

bool BlockStore::FlushFor(absl::Duration timeout) { return impl_->FlushFor(timeout); }

absl::StatusOr<ScrubProgress> BlockStore::Scrub(const ScrubOptions& options,
                                                const ScrubCallback& progress) {
  return impl_->Scrub(options, progress);
}

}  // namespace tutti::store
