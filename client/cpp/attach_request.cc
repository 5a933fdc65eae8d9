#include "client/cpp/attach_request.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tutti::client::internal {
namespace {

// Bytes from an object's base to the end of its last block.
uint64_t ObjectExtent(const AttachOptions& o, const ObjectTensor& t) {
  return (uint64_t{o.num_blocks} - 1) * t.block_stride + o.ns.layout.object_bytes();
}

tutti::v1::AttachRequest BaseRequest(const AttachOptions& o) {
  tutti::v1::AttachRequest req;
  req.set_engine_id(o.engine_id);
  *req.mutable_namespace_() = ToProto(o.ns);
  req.set_num_blocks(o.num_blocks);
  req.set_engine_pid(static_cast<uint32_t>(getpid()));
  req.set_namespace_secret(o.namespace_secret);
  return req;
}

void AddPlacement(tutti::v1::AttachRequest& req, uint32_t region, uint64_t offset,
                  uint64_t stride) {
  tutti::v1::ObjectPlacement* p = req.add_placements();
  p->set_region(region);
  p->set_offset(offset);
  p->set_block_stride(stride);
}

}  // namespace

absl::Status CheckOptions(const AttachOptions& o) {
  const KvLayout& l = o.ns.layout;
  const std::pair<const char*, uint32_t> fields[] = {
      {"num_layers", l.num_layers},     {"kv_heads", l.kv_heads},
      {"head_dim", l.head_dim},         {"dtype_bytes", l.dtype_bytes},
      {"block_tokens", l.block_tokens}, {"num_blocks", o.num_blocks},
  };
  for (const auto& [name, value] : fields) {
    if (value == 0) return absl::InvalidArgumentError(absl::StrCat(name, " must be at least 1"));
  }
  const uint64_t want = uint64_t{l.num_layers} * l.parts();
  if (o.objects.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("objects: ", o.objects.size(), " entries; the layout has ", want,
                     " (num_layers x ", l.parts(), " parts, layer-major)"));
  }
  for (size_t i = 0; i < o.objects.size(); ++i) {
    const ObjectTensor& t = o.objects[i];
    if (t.base == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("objects[", i, "]: null"));
    if (o.num_blocks > 1 && t.block_stride < l.object_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("objects[", i, "]: block_stride ",
                                                     t.block_stride, " is smaller than an object (",
                                                     l.object_bytes(), " bytes)"));
    }
  }
  return absl::OkStatus();
}

tutti::v1::Namespace ToProto(const ModelNamespace& ns) {
  tutti::v1::Namespace out;
  out.set_model_id(ns.model_id);
  out.set_tp_rank(ns.tp_rank);
  out.set_tp_size(ns.tp_size);
  out.set_hash_scheme(ns.hash_scheme);
  tutti::v1::KvLayout* l = out.mutable_layout();
  l->set_num_layers(ns.layout.num_layers);
  l->set_kv_heads(ns.layout.kv_heads);
  l->set_head_dim(ns.layout.head_dim);
  l->set_dtype_bytes(ns.layout.dtype_bytes);
  l->set_block_tokens(ns.layout.block_tokens);
  l->set_format(static_cast<tutti::v1::KvFormat>(ns.layout.format));
  return out;
}

absl::StatusOr<tutti::v1::AttachRequest> BuildHostAttach(const AttachOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  if (o.host_regions.empty()) {
    return absl::InvalidArgumentError("host mode needs host_regions (shared memory)");
  }
  tutti::v1::AttachRequest req = BaseRequest(o);
  for (const HostRegion& r : o.host_regions) {
    if (r.shm_name.empty() || r.data == nullptr || r.size == 0) {
      return absl::InvalidArgumentError("host_regions: name, data and size must be set");
    }
    tutti::v1::HostShmRegion* shm = req.add_regions()->mutable_host_shm();
    shm->set_fd_index(static_cast<uint32_t>(req.regions_size() - 1));  // OpenHostRegions' order
    shm->set_name(r.shm_name);
    shm->set_size_bytes(r.size);
  }
  for (size_t i = 0; i < o.objects.size(); ++i) {
    const auto base = reinterpret_cast<uintptr_t>(o.objects[i].base);
    const uint64_t extent = ObjectExtent(o, o.objects[i]);
    bool placed = false;
    for (size_t r = 0; r < o.host_regions.size() && !placed; ++r) {
      const auto start = reinterpret_cast<uintptr_t>(o.host_regions[r].data);
      if (base < start || base - start > o.host_regions[r].size ||
          o.host_regions[r].size - (base - start) < extent) {
        continue;
      }
      AddPlacement(req, static_cast<uint32_t>(r), base - start, o.objects[i].block_stride);
      placed = true;
    }
    if (!placed) {
      return absl::InvalidArgumentError(
          absl::StrCat("objects[", i, "]: its ", o.num_blocks, " blocks (", extent,
                       " bytes from its base) do not lie inside any of the host_regions"));
    }
  }
  return req;
}

absl::StatusOr<std::vector<UniqueFd>> OpenHostRegions(const AttachOptions& o) {
  std::vector<UniqueFd> fds;
  if (o.mode != MemoryMode::kHost) return fds;
  for (size_t i = 0; i < o.host_regions.size(); ++i) {
    UniqueFd fd(shm_open(o.host_regions[i].shm_name.c_str(), O_RDWR | O_CLOEXEC, 0));
    if (!fd.valid()) {
      return absl::InvalidArgumentError(absl::StrCat("host_regions[", i, "]: shm_open(",
                                                     o.host_regions[i].shm_name,
                                                     "): ", strerror(errno)));
    }
    fds.push_back(std::move(fd));
  }
  return fds;
}

absl::StatusOr<tutti::v1::AttachRequest> BuildCudaAttach(const AttachOptions& o, Device& device,
                                                         const ReadyWords& words) {
  RETURN_IF_ERROR(CheckOptions(o));
  tutti::v1::AttachRequest req = BaseRequest(o);
  std::map<uintptr_t, uint32_t> region_of;  // allocation base -> region index
  for (size_t i = 0; i < o.objects.size(); ++i) {
    const auto base = reinterpret_cast<uintptr_t>(o.objects[i].base);
    ASSIGN_OR_RETURN(const Allocation alloc, device.AllocationOf(o.objects[i].base));
    const uint64_t offset = base - alloc.base;
    const uint64_t extent = ObjectExtent(o, o.objects[i]);
    if (base < alloc.base || offset > alloc.size || alloc.size - offset < extent) {
      return absl::InvalidArgumentError(
          absl::StrCat("objects[", i, "]: its ", o.num_blocks, " blocks (", extent,
                       " bytes) run past the end of the device allocation that holds its base"));
    }
    auto [it, inserted] = region_of.emplace(alloc.base, req.regions_size());
    if (inserted) {
      ASSIGN_OR_RETURN(tutti::v1::CudaIpcRegion region, device.Export(alloc));
      *req.add_regions()->mutable_cuda_ipc() = std::move(region);
    }
    AddPlacement(req, it->second, offset, o.objects[i].block_stride);
  }
  ASSIGN_OR_RETURN(tutti::v1::CudaIpcRegion words_region, words.Export());
  *req.mutable_ready_words()->mutable_region() = std::move(words_region);
  req.mutable_ready_words()->set_count(words.count());
  return req;
}

}  // namespace tutti::client::internal
