// Internal: turns AttachOptions into tuttid's AttachRequest: checks the layout, and places every
// object of the engine's layout in a memory region (a shared-memory region in host mode; an
// exported device allocation in cuda mode), as (region, offset, block_stride).
//
// Both modes send this process's pid (engine_pid), so tuttid ends the session when it exits.
//
// Thread-safety: pure functions (the Device's own rules apply).
#ifndef TUTTI_CLIENT_CPP_ATTACH_REQUEST_H_
#define TUTTI_CLIENT_CPP_ATTACH_REQUEST_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/device.h"
#include "common/unique_fd.h"
#include "tutti/client.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::client::internal {

// INVALID_ARGUMENT naming the field when a layout field is 0, num_blocks is 0, the object count
// is not num_layers * parts, an object has a null base, or (num_blocks > 1) a block stride is
// smaller than the object size.
absl::Status CheckOptions(const AttachOptions& options);

// The namespace as tuttid wants it.
tutti::v1::Namespace ToProto(const ModelNamespace& ns);

// Host mode: every object's blocks must lie inside one of options.host_regions (INVALID_ARGUMENT
// naming the object otherwise). Runs CheckOptions first.
// Region i is handed over as descriptor i of the handoff (fd_index i).
absl::StatusOr<tutti::v1::AttachRequest> BuildHostAttach(const AttachOptions& options);

// Host mode: opens each of options.host_regions by its shm name, read-write, in order: the
// descriptors the session hands tuttid before every Attach (tuttid never opens names itself).
// Nothing in cuda mode. INVALID_ARGUMENT naming the region and errno when one cannot be opened.
absl::StatusOr<std::vector<UniqueFd>> OpenHostRegions(const AttachOptions& options);

// Cuda mode: one region per device allocation that holds objects (an object's blocks must lie in
// one allocation: INVALID_ARGUMENT otherwise) and the ready words. Runs
// CheckOptions first; the Device's errors as they are.
absl::StatusOr<tutti::v1::AttachRequest> BuildCudaAttach(const AttachOptions& options,
                                                         Device& device, const ReadyWords& words);

}  // namespace tutti::client::internal

#endif  // TUTTI_CLIENT_CPP_ATTACH_REQUEST_H_
