#include "daemon/datapath/bounce_slots.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tutti::datapath {

absl::StatusOr<std::unique_ptr<BounceSlots>> BounceSlots::Create(absl::Span<uint8_t> region,
                                                                uint32_t files, uint32_t depth,
                                                                uint32_t slot_bytes) {
  if (files == 0 || depth == 0 || slot_bytes == 0 || slot_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bounce slots: ", files, " files x ", depth,
                                                   " slots of ", slot_bytes,
                                                   " bytes (counts > 0, a multiple of 4096)"));
  }
  if (reinterpret_cast<uintptr_t>(region.data()) % 4096 != 0 ||
      region.size() < BytesFor(files, depth, slot_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bounce slots: ", files, " files x ", depth, " slots of ", slot_bytes, " bytes need ",
        BytesFor(files, depth, slot_bytes), " bytes of 4 KiB-aligned host staging; it has ",
        region.size()));
  }
  return std::unique_ptr<BounceSlots>(new BounceSlots(region, files, depth, slot_bytes));
}

BounceSlots::BounceSlots(absl::Span<uint8_t> region, uint32_t files, uint32_t depth,
                         uint32_t slot_bytes)
    : slot_bytes_(slot_bytes), num_files_(files), files_(files) {
  uint8_t* next = region.data();
  for (File& f : files_) {
    for (uint32_t i = 0; i < depth; ++i, next += slot_bytes) f.free.push_back(next);
  }
}

void BounceSlots::Acquire(uint32_t file, uint64_t stream, Start start) {
  uint8_t* slot = nullptr;
  {
    absl::MutexLock lock(&mu_);
    File& f = files_[file];
    if (f.free.empty() || !f.waiting.empty()) {
      f.waiting.Push(stream, std::move(start));
      return;
    }
    slot = f.free.back();
    f.free.pop_back();
    most_held_ = std::max(most_held_, ++held_);
  }
  start(slot);
}

void BounceSlots::Release(uint32_t file, uint8_t* slot) {
  Start next;
  {
    absl::MutexLock lock(&mu_);
    File& f = files_[file];
    if (f.waiting.empty()) {
      f.free.push_back(slot);
      --held_;
      return;
    }
    next = f.waiting.Pop();  // the slot passes straight to the next batch
  }
  next(slot);
}

uint32_t BounceSlots::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

uint32_t BounceSlots::most_held() const {
  absl::MutexLock lock(&mu_);
  return most_held_;
}

}  // namespace tutti::datapath
