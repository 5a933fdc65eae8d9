// Fuzz target: slot header decoding (pool::DecodeSlotHeader), on the input as given and with its
// checksum re-sealed. A header that decodes re-encodes to bytes that decode to the same header.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "daemon/pool/layout.h"
#include "daemon/pool/slot_header.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using tutti::pool::kSlotHeaderBytes;

void Check(const std::vector<uint8_t>& page) {
  absl::StatusOr<tutti::pool::SlotHeader> h = tutti::pool::DecodeSlotHeader(page);
  if (!h.ok()) return;
  std::vector<uint8_t> again(kSlotHeaderBytes);
  absl::Status s = tutti::pool::EncodeSlotHeader(*h, absl::MakeSpan(again));
  absl::StatusOr<tutti::pool::SlotHeader> h2 =
      s.ok() ? tutti::pool::DecodeSlotHeader(again) : absl::StatusOr<tutti::pool::SlotHeader>(s);
  if (!h2.ok() || h2->ns != h->ns || h2->key.bytes != h->key.bytes || h2->epoch != h->epoch ||
      h2->object_len != h->object_len || h2->checksums != h->checksums) {
    std::fprintf(stderr, "decoded header does not round-trip: %s\n", s.ToString().c_str());
    abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // As given, any length (a short buffer must be refused, not read past).
  (void)tutti::pool::DecodeSlotHeader(absl::MakeConstSpan(data, size));
  std::vector<uint8_t> page(kSlotHeaderBytes, 0);
  std::memcpy(page.data(), data, std::min<size_t>(size, kSlotHeaderBytes));
  Check(page);
  tutti::fuzz::SealSlotHeader(page.data());
  Check(page);
  return 0;
}
