// Checks of engine requests that need no state beyond the session's shape. Private to
// daemon/server. Every error is INVALID_ARGUMENT naming the offending field and index.
//
// Thread-safety: pure functions.
#ifndef TUTTI_DAEMON_SERVER_REQUEST_CHECKS_H_
#define TUTTI_DAEMON_SERVER_REQUEST_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"
#include "google/protobuf/repeated_field.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::server {

// The pairs of a Retrieve or Store, split.
struct BlockBatch {
  std::vector<Key> keys;
  std::vector<uint32_t> engine_blocks;
};

struct LayerRange {
  uint32_t begin = 0;
  uint32_t end = 0;
};

// A Lookup chain: at most `max_keys` keys, each exactly 16 bytes, none repeated. May be empty.
absl::StatusOr<std::vector<Key>> ParseKeys(
    const google::protobuf::RepeatedPtrField<std::string>& keys, uint32_t max_keys);

// A LookupRequest's chain: `keys`, or `packed_keys` (16 bytes per key), not both; as ParseKeys.
absl::StatusOr<std::vector<Key>> ParseLookupKeys(const tutti::v1::LookupRequest& req,
                                                 uint32_t max_keys);

// Retrieve and Store pairs: 1 to `max_blocks` pairs; keys 16 bytes and distinct; engine blocks
// below `num_engine_blocks` and distinct.
absl::StatusOr<BlockBatch> ParseBlocks(
    const google::protobuf::RepeatedPtrField<tutti::v1::BlockPair>& blocks,
    uint32_t num_engine_blocks, uint32_t max_blocks);

// The leases a Retrieve names: lease_id (unless it is 0 and lease_ids is not empty), then
// lease_ids; at most kMaxLeasesPerRetrieve in lease_ids, none named twice. Never empty (a lone
// lease_id 0 is returned as is: the session manager answers NOT_FOUND).
inline constexpr int kMaxLeasesPerRetrieve = 1024;
absl::StatusOr<std::vector<uint64_t>> ParseLeaseIds(const tutti::v1::RetrieveRequest& req);

// [begin, end) with end = 0 meaning num_layers; requires begin < end <= num_layers.
absl::StatusOr<LayerRange> ParseLayerRange(uint32_t begin, uint32_t end, uint32_t num_layers);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_REQUEST_CHECKS_H_
