#include "daemon/io/nvme/descriptors.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tutti::io::nvme {
namespace {

struct PrpGeometry {
  uint64_t pages = 0;  // data pages in the region
  uint32_t entries_per_page = 0;
  uint32_t window = 0;  // data pages per list page
  uint64_t list_pages = 0;
};

// A transfer of max_transfer bytes at any dword offset touches max_transfer/page + 1 pages; the
// list holds all but the first.
absl::StatusOr<PrpGeometry> Geometry(const DescriptorOptions& o, uint64_t region_bytes) {
  PrpGeometry g;
  const uint64_t page = 1ull << o.page_shift;
  g.pages = (region_bytes + page - 1) >> o.page_shift;
  g.entries_per_page = static_cast<uint32_t>(page / 8);
  uint64_t max_entries = o.max_transfer / page + 1;
  if (max_entries >= g.entries_per_page) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_transfer ", o.max_transfer, " needs ", max_entries,
        " PRP entries per command; a list page holds ", g.entries_per_page, " (lower it)"));
  }
  g.window = static_cast<uint32_t>(g.entries_per_page - max_entries + 1);
  g.list_pages = (g.pages + g.window - 1) / g.window;
  return g;
}

}  // namespace

uint64_t DescriptorMemoryBytes(const DescriptorOptions& options, uint64_t region_bytes) {
  if (options.use_sgl) return 0;
  auto g = Geometry(options, region_bytes);
  return g.ok() ? g->list_pages << options.page_shift : 0;
}

absl::StatusOr<std::unique_ptr<RegisteredRegion>> RegisteredRegion::Create(
    const DescriptorOptions& options, const DmaBuffer& buffer, DmaAllocator* dma) {
  const uint64_t page = 1ull << options.page_shift;
  if (buffer.size() == 0 || buffer.iova() % page != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DMA region at iova 0x", absl::Hex(buffer.iova()), " size ", buffer.size(),
                     ": must be non-empty and page-aligned"));
  }
  RegionDescriptor d;
  d.iova = buffer.iova();
  d.size = buffer.size();
  d.page_shift = options.page_shift;
  d.max_transfer = options.max_transfer;
  d.use_sgl = options.use_sgl ? 1 : 0;
  if (options.use_sgl) {
    return std::unique_ptr<RegisteredRegion>(new RegisteredRegion(buffer, d, nullptr));
  }
  ASSIGN_OR_RETURN(PrpGeometry g, Geometry(options, buffer.size()));
  ASSIGN_OR_RETURN(std::unique_ptr<DmaBuffer> lists, dma->Allocate(g.list_pages * page));
  auto* entries = reinterpret_cast<uint64_t*>(lists->host());
  for (uint64_t w = 0; w < g.list_pages; ++w) {
    for (uint32_t s = 0; s < g.entries_per_page; ++s) {
      uint64_t data_page = w * g.window + s;
      entries[w * g.entries_per_page + s] = data_page < g.pages ? d.iova + data_page * page : 0;
    }
  }
  d.prp_list_iova = lists->iova();
  d.prp_window = g.window;
  return std::unique_ptr<RegisteredRegion>(new RegisteredRegion(buffer, d, std::move(lists)));
}

}  // namespace tutti::io::nvme
