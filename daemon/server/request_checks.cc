#include "daemon/server/request_checks.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tutti::server {
namespace {

absl::Status ParseKey(const std::string& raw, absl::string_view field, int index, Key* out) {
  if (Key::FromBytes(raw, out)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, "[", index, "]: a key must be exactly ",
                                                 Key::kSize, " bytes, got ", raw.size()));
}

absl::Status CheckCount(absl::string_view field, int n, uint32_t max) {
  if (static_cast<uint32_t>(n) <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", n, " in one call, at most ", max, " (limits.max_blocks_per_call)"));
}

}  // namespace

namespace {

// INVALID_ARGUMENT naming the first key of `keys` that repeats an earlier one.
absl::Status CheckDistinct(const std::vector<Key>& keys, absl::string_view field) {
  // Sized once: growing it was most of a 2048-key Lookup's handler time (perf, issue 12).
  absl::flat_hash_set<Key> seen;
  seen.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!seen.insert(keys[i]).second) {
      const auto first = std::find(keys.begin(), keys.begin() + i, keys[i]) - keys.begin();
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: duplicate of ", field, "[", first, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Key>> ParseKeys(
    const google::protobuf::RepeatedPtrField<std::string>& keys, uint32_t max_keys) {
  RETURN_IF_ERROR(CheckCount("keys", keys.size(), max_keys));
  std::vector<Key> out(keys.size());
  for (int i = 0; i < keys.size(); ++i) RETURN_IF_ERROR(ParseKey(keys[i], "keys", i, &out[i]));
  RETURN_IF_ERROR(CheckDistinct(out, "keys"));
  return out;
}

absl::StatusOr<std::vector<Key>> ParseLookupKeys(const tutti::v1::LookupRequest& req,
                                                 uint32_t max_keys) {
  const std::string& packed = req.packed_keys();
  if (packed.empty()) return ParseKeys(req.keys(), max_keys);
  if (!req.keys().empty()) {
    return absl::InvalidArgumentError("give keys or packed_keys, not both");
  }
  if (packed.size() % Key::kSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packed_keys: ", packed.size(), " bytes; must be a multiple of 16 (16 bytes per key)"));
  }
  const size_t n = packed.size() / Key::kSize;
  RETURN_IF_ERROR(CheckCount("packed_keys", static_cast<int>(std::min<size_t>(n, 1u << 30)),
                             max_keys));
  static_assert(sizeof(Key) == Key::kSize && std::is_trivially_copyable_v<Key>,
                "packed_keys is copied into the keys whole");
  std::vector<Key> out(n);
  if (n > 0) std::memcpy(out.data(), packed.data(), n * Key::kSize);
  RETURN_IF_ERROR(CheckDistinct(out, "packed_keys"));
  return out;
}

absl::StatusOr<std::vector<uint64_t>> ParseLeaseIds(const tutti::v1::RetrieveRequest& req) {
  if (req.lease_ids_size() > kMaxLeasesPerRetrieve) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ids: ", req.lease_ids_size(),
                                                   " in one call, at most ",
                                                   kMaxLeasesPerRetrieve));
  }
  std::vector<uint64_t> out;
  out.reserve(req.lease_ids_size() + 1);
  if (req.lease_id() != 0 || req.lease_ids().empty()) out.push_back(req.lease_id());
  absl::flat_hash_map<uint64_t, int> seen;  // lease id -> index in lease_ids, -1: lease_id
  if (req.lease_id() != 0) seen.emplace(req.lease_id(), -1);
  for (int i = 0; i < req.lease_ids_size(); ++i) {
    auto [it, fresh] = seen.emplace(req.lease_ids(i), i);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lease_ids[", i, "]: lease ", req.lease_ids(i), " is named twice (also in ",
          it->second < 0 ? std::string("lease_id") : absl::StrCat("lease_ids[", it->second, "]"),
          ")"));
    }
    out.push_back(req.lease_ids(i));
  }
  return out;
}

absl::StatusOr<BlockBatch> ParseBlocks(
    const google::protobuf::RepeatedPtrField<tutti::v1::BlockPair>& blocks,
    uint32_t num_engine_blocks, uint32_t max_blocks) {
  if (blocks.empty()) return absl::InvalidArgumentError("blocks: at least one pair is needed");
  RETURN_IF_ERROR(CheckCount("blocks", blocks.size(), max_blocks));
  BlockBatch batch;
  batch.keys.resize(blocks.size());
  batch.engine_blocks.resize(blocks.size());
  absl::flat_hash_map<Key, int> seen_keys;
  absl::flat_hash_map<uint32_t, int> seen_blocks;
  seen_keys.reserve(blocks.size());
  seen_blocks.reserve(blocks.size());
  for (int i = 0; i < blocks.size(); ++i) {
    const auto& pair = blocks[i];
    RETURN_IF_ERROR(ParseKey(pair.key(), "blocks", i, &batch.keys[i]));
    if (pair.engine_block() >= num_engine_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("blocks[", i, "].engine_block = ", pair.engine_block(),
                       ": the session's memory has blocks [0, ", num_engine_blocks, ")"));
    }
    if (auto [it, fresh] = seen_keys.emplace(batch.keys[i], i); !fresh) {
      return absl::InvalidArgumentError(
          absl::StrCat("blocks[", i, "].key: duplicate of blocks[", it->second, "]"));
    }
    if (auto [it, fresh] = seen_blocks.emplace(pair.engine_block(), i); !fresh) {
      return absl::InvalidArgumentError(absl::StrCat("blocks[", i,
                                                     "].engine_block = ", pair.engine_block(),
                                                     ": duplicate of blocks[", it->second, "]"));
    }
    batch.engine_blocks[i] = pair.engine_block();
  }
  return batch;
}

absl::StatusOr<LayerRange> ParseLayerRange(uint32_t begin, uint32_t end, uint32_t num_layers) {
  LayerRange r{begin, end == 0 ? num_layers : end};
  if (r.begin < r.end && r.end <= num_layers) return r;
  return absl::InvalidArgumentError(absl::StrCat("layer range [", begin, ", ", end,
                                                 "): need layer_begin < layer_end <= ", num_layers,
                                                 " (layer_end 0 means all layers)"));
}

}  // namespace tutti::server
