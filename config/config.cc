#include "config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "config/text_scan.h"
#include "daemon/datapath/bounce_slots.h"
#include "daemon/io/backend_registry.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace tutti::config {

// Defined in the .cc generated from default.textproto (see config/BUILD).
extern const char kDefaultConfigText[];

namespace {

using tutti::v1::Config;

constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
constexpr uint64_t kTiB = kGiB * 1024, kPiB = kTiB * 1024;
constexpr size_t kMaxSocketPath = 107;  // sizeof(sockaddr_un::sun_path) - 1
constexpr uint32_t kMaxGpuDevice = 63;
constexpr uint32_t kMaxIoSms = 1024;
constexpr uint32_t kMaxCopyCtas = 65535;
constexpr uint64_t kMaxConfigFileBytes = 1 * kMiB;

// Remembers the first parse error and its position (0-based, as the tokenizer counts).
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!has_error_) {
      has_error_ = true;
      line_ = line;
      column_ = column;
      message_ = message;
    }
  }
  // INVALID_ARGUMENT "line <l>, column <c>: <field path>: <what>" (1-based; the path of the field
  // the error is in, when the scan of the text reached it).
  absl::Status ToStatus(const std::vector<internal::FieldMention>& fields) const {
    if (!has_error_) return absl::InvalidArgumentError("cannot parse the config");
    const std::string path = internal::FieldAt(fields, line_, column_);
    return absl::InvalidArgumentError(absl::StrCat("line ", line_ + 1, ", column ", column_ + 1,
                                                   ": ", path, path.empty() ? "" : ": ", message_));
  }

 private:
  bool has_error_ = false;
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

// INVALID_ARGUMENT naming a non-repeated field that the text gives more than once.
absl::Status RefuseRepeatedSingularFields(const std::vector<internal::FieldMention>& fields) {
  const internal::FieldMention* first = nullptr;
  const internal::FieldMention* again = internal::FindRepeatedSingular(fields, &first);
  if (again == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("line ", again->line + 1, ", column ", again->column + 1, ": ", again->path,
                   " is given twice (first at line ", first->line + 1, ", column ",
                   first->column + 1, "); a field that is not a list may appear once"));
}

absl::Status Bad(absl::string_view field, const std::string& value, absl::string_view allowed) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, ": ", allowed));
}

absl::Status CheckRange(absl::string_view field, uint64_t v, uint64_t lo, uint64_t hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return Bad(field, absl::StrCat(v), absl::StrCat("must be in [", lo, ", ", hi, "]"));
}

// A share of the pool: in (0, 1].
absl::Status CheckShare(absl::string_view field, double v) {
  if (v > 0 && v <= 1) return absl::OkStatus();
  return Bad(field, absl::StrCat(v), "must be in (0, 1]");
}

absl::Status CheckOneOf(absl::string_view field, const std::string& v,
                        const std::vector<std::string>& allowed) {
  for (const auto& a : allowed) {
    if (v == a) return absl::OkStatus();
  }
  return Bad(field, absl::StrCat("\"", v, "\""),
             absl::StrCat("must be one of ", absl::StrJoin(allowed, ", ")));
}

absl::Status CheckAbsolutePath(absl::string_view field, const std::string& path) {
  if (!path.empty() && path[0] == '/') return absl::OkStatus();
  return Bad(field, absl::StrCat("\"", path, "\""), "must be an absolute path");
}

absl::Status CheckSocket(absl::string_view field, const std::string& path, size_t suffix) {
  RETURN_IF_ERROR(CheckAbsolutePath(field, path));
  if (path.size() + suffix > kMaxSocketPath) {
    return Bad(field, absl::StrCat("\"", path, "\""),
               absl::StrCat("must be at most ", kMaxSocketPath - suffix, " characters (sun_path",
                            suffix > 0 ? ", with the \".handoff\" socket beside it)" : ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckAccess(absl::string_view mode_field, uint32_t mode,
                         absl::string_view group_field, const std::string& group) {
  if (mode > 0777) {
    return Bad(mode_field, absl::StrFormat("0%o", mode), "must be a permission mode in [0, 0777]");
  }
  if (group.size() > 32 || group.find_first_of("/: ") != std::string::npos) {
    return Bad(group_field, absl::StrCat("\"", group, "\""),
               "must be a group name of at most 32 characters, or empty");
  }
  return absl::OkStatus();
}

}  // namespace

std::string AdminSocketPath(const tutti::v1::ListenConfig& l) {
  return l.admin_socket_path().empty() ? l.socket_path() + ".admin" : l.admin_socket_path();
}

namespace {

absl::Status ValidateListen(const tutti::v1::ListenConfig& l) {
  // The longest suffix of the sockets beside it: ".handoff" (".lookup" is shorter).
  RETURN_IF_ERROR(CheckSocket("listen.socket_path", l.socket_path(), sizeof(".handoff") - 1));
  RETURN_IF_ERROR(
      CheckAccess("listen.socket_mode", l.socket_mode(), "listen.socket_group", l.socket_group()));
  if (!l.admin_socket_path().empty()) {
    RETURN_IF_ERROR(CheckSocket("listen.admin_socket_path", l.admin_socket_path(), 0));
  }
  if (AdminSocketPath(l) == l.socket_path()) {
    return Bad("listen.admin_socket_path", absl::StrCat("\"", l.admin_socket_path(), "\""),
               "must differ from listen.socket_path (engines must not reach the operator API)");
  }
  return CheckAccess("listen.admin_socket_mode", l.admin_socket_mode(),
                     "listen.admin_socket_group", l.admin_socket_group());
}

absl::Status ValidatePool(const tutti::v1::PoolConfig& p) {
  std::set<std::string> seen;
  for (int i = 0; i < p.dirs_size(); ++i) {
    const std::string field = absl::StrCat("pool.dirs[", i, "]");
    RETURN_IF_ERROR(CheckAbsolutePath(field, p.dirs(i)));
    if (!seen.insert(p.dirs(i)).second) {
      return Bad(field, absl::StrCat("\"", p.dirs(i), "\""), "must not repeat another directory");
    }
  }
  RETURN_IF_ERROR(CheckRange("pool.capacity_bytes", p.capacity_bytes(), 64 * kMiB, kPiB));
  if (p.object_bytes() % 4096 != 0 || p.object_bytes() < 4 * kKiB || p.object_bytes() > 64 * kMiB) {
    return Bad("pool.object_bytes", absl::StrCat(p.object_bytes()),
               absl::StrCat("must be a multiple of 4096 in [4096, ", 64 * kMiB, "]"));
  }
  RETURN_IF_ERROR(CheckRange("pool.max_objects", p.max_objects(), 1, kMaxObjectsPerSlot));
  RETURN_IF_ERROR(CheckRange("pool.extent_slots", p.extent_slots(), 0, kMaxExtentSlots));
  RETURN_IF_ERROR(CheckOneOf("pool.admission", p.admission(), {"", "all", "second_sight", "dram_front"}));
  RETURN_IF_ERROR(CheckOneOf("pool.recency", p.recency(), {"", "tail_first", "chain"}));
  return CheckRange("pool.admission_ghost_blocks", p.admission_ghost_blocks(), 0, 1ull << 28);
}

// A PCI address as sysfs spells it: "0000:01:00.0" (domain:bus:device.function, lower-case hex).
bool IsPciAddress(const std::string& a) {
  if (a.size() != 12 || a[4] != ':' || a[7] != ':' || a[10] != '.') return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (i == 4 || i == 7 || i == 10) continue;
    if (!((a[i] >= '0' && a[i] <= '9') || (a[i] >= 'a' && a[i] <= 'f'))) return false;
  }
  return a[11] <= '7';
}

// "nvme" needs its SSDs' PCI addresses, each well-formed, none repeated.
absl::Status ValidateNvme(const tutti::v1::IoConfig& io) {
  if (io.backend() == "nvme" && io.nvme_devices().empty()) {
    return Bad("io.nvme_devices", "[]",
               "io.backend \"nvme\" needs the PCI address of at least one SSD bound to vfio-pci "
               "(e.g. \"0000:01:00.0\", docs/nvme.md)");
  }
  for (int i = 0; i < io.nvme_devices_size(); ++i) {
    const std::string field = absl::StrCat("io.nvme_devices[", i, "]");
    const std::string& a = io.nvme_devices(i);
    if (!IsPciAddress(a)) {
      return Bad(field, absl::StrCat("\"", a, "\""),
                 "must be a PCI address DDDD:BB:DD.F in lower-case hex (e.g. \"0000:01:00.0\")");
    }
    for (int j = 0; j < i; ++j) {
      if (io.nvme_devices(j) == a) {
        return Bad(field, absl::StrCat("\"", a, "\""), "must not repeat another device");
      }
    }
  }
  return CheckRange("io.nvme_nsid", io.nvme_nsid(), 1, 0xfffffffe);
}

// "uring_cmd" needs its char devices, each an absolute path, none repeated.
absl::Status ValidatePassthrough(const tutti::v1::IoConfig& io) {
  if (io.backend() == "uring_cmd" && io.passthrough_devices().empty()) {
    return Bad("io.passthrough_devices", "[]",
               "io.backend \"uring_cmd\" needs at least one NVMe generic char device "
               "(e.g. \"/dev/ng0n1\")");
  }
  for (int i = 0; i < io.passthrough_devices_size(); ++i) {
    const std::string field = absl::StrCat("io.passthrough_devices[", i, "]");
    RETURN_IF_ERROR(CheckAbsolutePath(field, io.passthrough_devices(i)));
    for (int j = 0; j < i; ++j) {
      if (io.passthrough_devices(j) == io.passthrough_devices(i)) {
        return Bad(field, absl::StrCat("\"", io.passthrough_devices(i), "\""),
                   "must not repeat another device");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateIo(const tutti::v1::IoConfig& io) {
  RETURN_IF_ERROR(
      CheckOneOf("io.backend", io.backend(),
                 std::vector<std::string>(io::kBackendNames.begin(), io::kBackendNames.end())));
  RETURN_IF_ERROR(ValidateNvme(io));
  RETURN_IF_ERROR(CheckOneOf(
      "io.fallback", io.fallback(),
      std::vector<std::string>(io::kFallbackValues.begin(), io::kFallbackValues.end())));
  RETURN_IF_ERROR(ValidatePassthrough(io));
  RETURN_IF_ERROR(CheckRange("io.memory_read_workers", io.memory_read_workers(), 1, 64));
  RETURN_IF_ERROR(CheckRange("io.memory_read_rings", io.memory_read_rings(), 1, 16));
  return CheckRange("io.queue_depth", io.queue_depth(), 1, 4096);
}

absl::Status ValidateLimits(const tutti::v1::LimitsConfig& l, const tutti::v1::PoolConfig& p) {
  const uint64_t block_bytes = uint64_t{p.max_objects()} * p.object_bytes();
  RETURN_IF_ERROR(CheckRange("limits.max_blocks_per_call", l.max_blocks_per_call(), 1, 65536));
  RETURN_IF_ERROR(CheckRange("limits.session_ttl_ms", l.session_ttl_ms(), 100, 86400000));
  RETURN_IF_ERROR(CheckRange("limits.lease_ttl_ms", l.lease_ttl_ms(), 100, 86400000));
  if (l.store_staging_bytes() < block_bytes || l.store_staging_bytes() > kTiB) {
    return Bad("limits.store_staging_bytes", absl::StrCat(l.store_staging_bytes()),
               absl::StrCat("must be in [", block_bytes, ", ", kTiB,
                            "] (at least one block: pool.max_objects x pool.object_bytes)"));
  }
  // One layer (K and V) of a maximal Retrieve must fit.
  const uint64_t layer_bytes = uint64_t{l.max_blocks_per_call()} * 2 * p.object_bytes();
  if (l.retrieve_staging_bytes() < layer_bytes || l.retrieve_staging_bytes() > kTiB) {
    return Bad("limits.retrieve_staging_bytes", absl::StrCat(l.retrieve_staging_bytes()),
               absl::StrCat("must be in [", layer_bytes, ", ", kTiB,
                            "] (at least limits.max_blocks_per_call x 2 x pool.object_bytes)"));
  }
  RETURN_IF_ERROR(CheckRange("limits.max_sessions", l.max_sessions(), 1, 65536));
  RETURN_IF_ERROR(
      CheckRange("limits.max_sessions_per_user", l.max_sessions_per_user(), 1, l.max_sessions()));
  RETURN_IF_ERROR(
      CheckRange("limits.max_leases_per_session", l.max_leases_per_session(), 1, 1u << 20));
  RETURN_IF_ERROR(CheckRange("limits.max_pinned_blocks_per_session",
                             l.max_pinned_blocks_per_session(), l.max_blocks_per_call(),
                             1u << 30));
  RETURN_IF_ERROR(CheckRange("limits.max_pinned_blocks", l.max_pinned_blocks(),
                             l.max_pinned_blocks_per_session(), uint64_t{1} << 34));
  RETURN_IF_ERROR(CheckRange("limits.max_pinned_blocks_per_user", l.max_pinned_blocks_per_user(),
                             l.max_blocks_per_call(), uint64_t{1} << 34));
  RETURN_IF_ERROR(
      CheckShare("limits.max_pinned_pool_share_per_user", l.max_pinned_pool_share_per_user()));
  RETURN_IF_ERROR(CheckShare("limits.max_pinned_pool_share", l.max_pinned_pool_share()));
  RETURN_IF_ERROR(
      CheckRange("limits.max_calls_per_session", l.max_calls_per_session(), 1, 4096));
  RETURN_IF_ERROR(CheckRange("limits.max_namespaces", l.max_namespaces(), 1, 1u << 20));
  RETURN_IF_ERROR(
      CheckRange("limits.max_namespaces_per_user", l.max_namespaces_per_user(), 1, 1u << 20));
  if (!(l.pool_share_per_user() > 0 && l.pool_share_per_user() <= 1)) {
    return Bad("limits.pool_share_per_user", absl::StrCat(l.pool_share_per_user()),
               "must be in (0, 1] (1: no bound)");
  }
  if (l.max_store_staging_bytes_per_session() != 0) {
    RETURN_IF_ERROR(CheckRange("limits.max_store_staging_bytes_per_session",
                               l.max_store_staging_bytes_per_session(), block_bytes,
                               l.store_staging_bytes()));
  }
  RETURN_IF_ERROR(
      CheckRange("limits.partial_store_ttl_ms", l.partial_store_ttl_ms(), 100, 3600000));
  RETURN_IF_ERROR(
      CheckRange("limits.max_pending_events", l.max_pending_events(), 1024, 1u << 24));
  // At least one namespace's ring; at most 2^30 events (about 40 GiB).
  RETURN_IF_ERROR(CheckRange("limits.max_pending_events_total", l.max_pending_events_total(),
                             l.max_pending_events(), uint64_t{1} << 30));
  RETURN_IF_ERROR(
      CheckRange("limits.max_handoff_connections", l.max_handoff_connections(), 1, 65536));
  RETURN_IF_ERROR(CheckRange("limits.max_handoff_connections_per_user",
                             l.max_handoff_connections_per_user(), 1,
                             l.max_handoff_connections()));
  RETURN_IF_ERROR(
      CheckRange("limits.max_lookup_connections", l.max_lookup_connections(), 1, 65536));
  RETURN_IF_ERROR(CheckRange("limits.max_lookup_connections_per_user",
                             l.max_lookup_connections_per_user(), 1, l.max_lookup_connections()));
  // A session needs two threads at least (a Retrieve stream and a KeepAlive).
  return CheckRange("limits.max_rpc_threads", l.max_rpc_threads(), 8, 65536);
}

absl::Status ValidateDram(const tutti::v1::DramTierConfig& d, const tutti::v1::PoolConfig& p) {
  const uint64_t block_bytes = uint64_t{p.max_objects()} * p.object_bytes();
  const uint64_t v = d.capacity_bytes();
  if (v == 0 && p.admission() == "dram_front") {
    return Bad("pool.admission", "\"dram_front\"",
               "keeps first-sight blocks in the DRAM tier, which is off (dram.capacity_bytes "
               "= 0): set dram.capacity_bytes to at least one block (pool.max_objects x "
               "pool.object_bytes) or choose another pool.admission");
  }
  if (v == 0 || (v >= block_bytes && v <= kPiB)) return absl::OkStatus();
  return Bad("dram.capacity_bytes", absl::StrCat(v),
             absl::StrCat("must be 0 (off) or in [", block_bytes, ", ", kPiB,
                          "] (at least one block: pool.max_objects x pool.object_bytes)"));
}

// The write backlog and the write caps of the I/O scheduler (datapath fields 2-4).
absl::Status ValidateWriteBacklog(const tutti::v1::DatapathConfig& d,
                                  const tutti::v1::LimitsConfig& l,
                                  const tutti::v1::PoolConfig& p) {
  const uint64_t block_bytes = uint64_t{p.max_objects()} * p.object_bytes();
  const uint64_t v = d.max_write_backlog_bytes();
  if (v != 0 && (v < block_bytes || v > l.store_staging_bytes())) {
    return Bad("datapath.max_write_backlog_bytes", absl::StrCat(v),
               absl::StrCat("must be 0 (limits.store_staging_bytes) or in [", block_bytes, ", ",
                            l.store_staging_bytes(),
                            "] (at least one block: pool.max_objects x pool.object_bytes; at most "
                            "limits.store_staging_bytes, which holds the backlog)"));
  }
  RETURN_IF_ERROR(CheckRange("datapath.max_write_backlog_age_ms", d.max_write_backlog_age_ms(),
                             100, 3600000));
  RETURN_IF_ERROR(
      CheckRange("datapath.write_latency_target_ms", d.write_latency_target_ms(), 0, 10000));
  RETURN_IF_ERROR(
      CheckRange("datapath.write_batches_in_flight", d.write_batches_in_flight(), 1, 64));
  RETURN_IF_ERROR(CheckRange("datapath.write_bytes_in_flight_while_reading",
                             d.write_bytes_in_flight_while_reading(), 4 * kKiB, kGiB));
  if (d.max_write_bytes_in_flight() < d.write_bytes_in_flight_while_reading() ||
      d.max_write_bytes_in_flight() > kGiB) {
    return Bad("datapath.max_write_bytes_in_flight", absl::StrCat(d.max_write_bytes_in_flight()),
               absl::StrCat("must be in [datapath.write_bytes_in_flight_while_reading (",
                            d.write_bytes_in_flight_while_reading(), "), ", kGiB, "]"));
  }
  return absl::OkStatus();
}

// The GPU section is checked here as far as it can be without a GPU; the device's SM count is
// checked against io_sm_count at start (IoStream::ValidateOptions).
// A read bandwidth prior: 0 (the default) or a finite rate of 1 MB/s .. 10 TB/s.
absl::Status CheckBandwidthPrior(absl::string_view field, double v) {
  if (v == 0 || (std::isfinite(v) && v >= 1e6 && v <= 1e13)) return absl::OkStatus();
  return Bad(field, absl::StrCat(v), "must be 0 (the default) or in [1e6, 1e13] bytes/s");
}

// The load-or-recompute fields (5-7) of datapath.
absl::Status ValidateDecision(const tutti::v1::DatapathConfig& d) {
  RETURN_IF_ERROR(CheckBandwidthPrior("datapath.ssd_read_prior_bytes_per_sec",
                                      d.ssd_read_prior_bytes_per_sec()));
  RETURN_IF_ERROR(CheckBandwidthPrior("datapath.dram_read_prior_bytes_per_sec",
                                      d.dram_read_prior_bytes_per_sec()));
  if (!(d.decision_min_gain() >= 0 && d.decision_min_gain() <= 0.9)) {
    return Bad("datapath.decision_min_gain", absl::StrCat(d.decision_min_gain()),
               "must be in [0, 0.9]");
  }
  return CheckOneOf("datapath.decision", d.decision(), {"", "auto", "off"});
}

absl::Status ValidateGpu(const tutti::v1::GpuConfig& g) {
  RETURN_IF_ERROR(CheckOneOf("gpu.mode", g.mode(), {"auto", "cuda", "host"}));
  RETURN_IF_ERROR(CheckRange("gpu.device", g.device(), 0, kMaxGpuDevice));
  if (g.io_sm_count() % 8 != 0 || g.io_sm_count() > kMaxIoSms) {
    return Bad("gpu.io_sm_count", absl::StrCat(g.io_sm_count()),
               absl::StrCat("must be a multiple of 8 in [0, ", kMaxIoSms,
                            "] (0: an ordinary stream on all SMs)"));
  }
  RETURN_IF_ERROR(CheckRange("gpu.copy_ctas", g.copy_ctas(), 0, kMaxCopyCtas));
  RETURN_IF_ERROR(CheckRange("gpu.round_bytes", g.round_bytes(), 0, kGiB));
  RETURN_IF_ERROR(CheckRange("gpu.max_staging_bytes", g.max_staging_bytes(), 8 * kMiB, 16 * kGiB));
  return CheckOneOf("gpu.scatter", g.scatter(), {"auto", "staged", "mapped", "copy_engine"});
}

absl::Status ValidateDatapath(const tutti::v1::DatapathConfig& d) {
  if (d.max_read_bytes() % 4096 != 0 || d.max_read_bytes() < 4 * kKiB ||
      d.max_read_bytes() > 64 * kMiB) {
    return Bad("datapath.max_read_bytes", absl::StrCat(d.max_read_bytes()),
               absl::StrCat("must be a multiple of 4096 in [4096, ", 64 * kMiB, "]"));
  }
  RETURN_IF_ERROR(CheckRange("datapath.checksum_threads", d.checksum_threads(), 0, 64));
  if (d.read_post_bytes() % 4096 != 0 || d.read_post_bytes() < 4 * kKiB ||
      d.read_post_bytes() > 256 * kMiB) {
    return Bad("datapath.read_post_bytes", absl::StrCat(d.read_post_bytes()),
               absl::StrCat("must be a multiple of 4096 in [4096, ", 256 * kMiB, "]"));
  }
  if (d.has_read_bounce_depth()) {
    RETURN_IF_ERROR(CheckRange("datapath.read_bounce_depth", d.read_bounce_depth(), 0, 1024));
  }
  RETURN_IF_ERROR(CheckRange("datapath.gpu_check_batch_objects", d.gpu_check_batch_objects(), 16,
                             65536));
  RETURN_IF_ERROR(CheckRange("datapath.gpu_check_slots", d.gpu_check_slots(), 2, 16));
  if (d.gpu_check_shared_objects() != 0) {
    RETURN_IF_ERROR(CheckRange("datapath.gpu_check_shared_objects", d.gpu_check_shared_objects(),
                               16, d.gpu_check_batch_objects()));
  }
  if (d.max_read_bytes_in_flight() != 0) {
    RETURN_IF_ERROR(CheckRange("datapath.max_read_bytes_in_flight", d.max_read_bytes_in_flight(),
                               4 * kKiB, 64 * kGiB));
  }
  RETURN_IF_ERROR(CheckOneOf("datapath.verifier", d.verifier(), {"auto", "cpu", "gpu"}));
  return CheckOneOf("datapath.store_checksums", d.store_checksums(), {"auto", "cpu", "gpu"});
}

// True for a dotted IPv4 address ("127.0.0.1"), each part a decimal in [0, 255].
bool IsIpv4(const std::string& host) {
  int parts = 0;
  size_t i = 0;
  while (i <= host.size()) {
    const size_t dot = std::min(host.find('.', i), host.size());
    const std::string part = host.substr(i, dot - i);
    if (part.empty() || part.size() > 3 || part.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(part) > 255) {
      return false;
    }
    ++parts;
    i = dot + 1;
  }
  return parts == 4;
}

// metrics.listen: "" or "off" (no endpoint), or HOST:PORT with HOST an IPv4 address or
// "localhost" (what prometheus-cpp's server parses exactly: it would bind 999.1.1.1 as
// 231.1.1.1) and PORT in [0, 65535] (0: any free port, logged at start). metrics.basic_auth_file:
// "" or an absolute path (its contents and mode are checked when the endpoint starts).
absl::Status ValidateMetrics(const tutti::v1::MetricsConfig& m) {
  const std::string& v = m.listen();
  if (v.empty() || v == "off") return absl::OkStatus();
  const size_t colon = v.rfind(':');
  const std::string host = colon == std::string::npos ? "" : v.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : v.substr(colon + 1);
  if ((host != "localhost" && !IsIpv4(host)) || port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535) {
    return Bad("metrics.listen", absl::StrCat("\"", v, "\""),
               "must be \"\", \"off\" or HOST:PORT with HOST an IPv4 address or localhost and "
               "PORT in [0, 65535] (e.g. \"127.0.0.1:9464\")");
  }
  const std::string& auth = m.basic_auth_file();
  if (!auth.empty() && auth[0] != '/') {
    return Bad("metrics.basic_auth_file", absl::StrCat("\"", auth, "\""),
               "must be \"\" or an absolute path (a file of one line \"user:password\")");
  }
  return absl::OkStatus();
}

// Prints every field, zero values included, so the log shows the whole effective config.
void PrintMessage(const google::protobuf::Message& m, int indent, std::string* out) {
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  const std::string pad(indent * 2, ' ');
  for (int i = 0; i < d->field_count(); ++i) {
    const auto* f = d->field(i);
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      absl::StrAppend(out, pad, f->name(), " {\n");
      PrintMessage(r->GetMessage(m, f), indent + 1, out);
      absl::StrAppend(out, pad, "}\n");
      continue;
    }
    if (f->is_repeated()) {
      for (int j = 0; j < r->FieldSize(m, f); ++j) {
        std::string v;
        google::protobuf::TextFormat::PrintFieldValueToString(m, f, j, &v);
        absl::StrAppend(out, pad, f->name(), ": ", v, "\n");
      }
      continue;
    }
    if (f->has_presence() && !r->HasField(m, f)) {  // unset means its own default: keep it so
      absl::StrAppend(out, pad, "# ", f->name(), ": unset (config.proto says what applies)\n");
      continue;
    }
    std::string v;
    if (f->name() == "socket_mode" || f->name() == "admin_socket_mode") {
      v = absl::StrFormat("0%o", r->GetUInt32(m, f));
    } else {
      google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &v);
    }
    absl::StrAppend(out, pad, f->name(), ": ", v, "\n");
  }
}

// errno as a status about the config file `path`: "cannot read config <path>: <what>: <strerror>".
absl::Status FileError(const std::string& path, const char* what, int err) {
  const std::string message =
      absl::StrCat("cannot read config ", path, ": ", what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::FailedPreconditionError(message);
  }
}

// The whole of the regular file at `path` (at most kMaxConfigFileBytes).
absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  // O_NONBLOCK: a FIFO must not hang start-up; it is refused below like any non-regular file.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return FileError(path, "open", errno);
  std::string text;
  struct stat st {};
  absl::Status status;
  if (fstat(fd, &st) != 0) {
    status = FileError(path, "fstat", errno);
  } else if (S_ISDIR(st.st_mode)) {
    status = FileError(path, "not a regular file", EISDIR);
  } else if (!S_ISREG(st.st_mode)) {
    status = FileError(path, "not a regular file", EINVAL);
  } else if (static_cast<uint64_t>(st.st_size) > kMaxConfigFileBytes) {
    status = absl::InvalidArgumentError(
        absl::StrCat("config ", path, ": ", st.st_size, " bytes; at most ", kMaxConfigFileBytes));
  }
  char buf[16384];
  while (status.ok()) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = FileError(path, "read", errno);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxConfigFileBytes) status = FileError(path, "read", EFBIG);
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

}  // namespace

std::string_view DefaultConfigText() { return kDefaultConfigText; }


namespace {

// limits.store_staging_bytes and limits.retrieve_staging_bytes at 0: this much per pool device,
// within [kAutoStagingMin, kAutoStagingMax], so that every device of an array has work queued
// (measured: docs/operations.md), and never less than ValidateLimits asks.
constexpr uint64_t kAutoStagingPerDevice = 256 * kMiB;
constexpr uint64_t kAutoStagingMin = 256 * kMiB;
constexpr uint64_t kAutoStagingMax = 1 * kGiB;

uint64_t PoolDevices(const Config& c) {
  const std::string& backend = c.io().backend();
  const int n = backend == "nvme"        ? c.io().nvme_devices_size()
                : backend == "uring_cmd" ? c.io().passthrough_devices_size()
                                         : c.pool().dirs_size();
  return static_cast<uint64_t>(std::max(n, 1));
}

uint64_t AutoStagingBytes(const Config& c, uint64_t at_least) {
  const uint64_t bytes =
      std::clamp(kAutoStagingPerDevice * PoolDevices(c), kAutoStagingMin, kAutoStagingMax);
  return std::max(bytes, at_least);
}

// Fills the fields whose 0 means "automatic" with their values, before validation.
void ResolveAutomatic(Config* c) {
  tutti::v1::LimitsConfig* l = c->mutable_limits();
  if (l->store_staging_bytes() == 0) {
    l->set_store_staging_bytes(
        AutoStagingBytes(*c, uint64_t{c->pool().max_objects()} * c->pool().object_bytes()));
  }
  if (l->retrieve_staging_bytes() == 0) {
    l->set_retrieve_staging_bytes(AutoStagingBytes(
        *c, uint64_t{l->max_blocks_per_call()} * 2 * c->pool().object_bytes()));
  }
}

// The embedded text as it is, automatic fields at 0.
Config EmbeddedConfig() {
  Config config;
  // The embedded text is checked by config_test; a failure here is a build defect.
  google::protobuf::TextFormat::ParseFromString(std::string(DefaultConfigText()), &config);
  return config;
}

}  // namespace

uint64_t ReadBounceSlotBytes(const Config& config) {
  return datapath::BounceSlots::SlotBytesFor(config.datapath().read_post_bytes(),
                                             config.datapath().max_read_bytes());
}

uint32_t ReadBounceDepth(const Config& config) {
  if (config.datapath().has_read_bounce_depth()) return config.datapath().read_bounce_depth();
  // docs/gpu.md, "Stop 55" and "Stop 57".
  constexpr uint64_t kFootprint = 64ull << 20, kLeastPerDevice = 8ull << 20;
  const uint64_t slot = std::max<uint64_t>(4096, ReadBounceSlotBytes(config));
  const auto devices = static_cast<uint64_t>(std::max(1, config.pool().dirs_size()));
  const uint64_t least = std::max<uint64_t>(2, (kLeastPerDevice + slot - 1) / slot);
  return static_cast<uint32_t>(
      std::min<uint64_t>(1024, std::max(least, kFootprint / slot / devices)));
}

uint64_t MaxReadBytesInFlight(const Config& config) {
  const tutti::v1::DatapathConfig& d = config.datapath();
  if (d.max_read_bytes_in_flight() != 0) return d.max_read_bytes_in_flight();
  // What the device's queue holds, and at least 16 whole batches (docs/gpu.md, "Stop 57").
  constexpr uint64_t kLeastBatches = 16;
  return std::max(uint64_t{std::max<uint32_t>(1, config.io().queue_depth())} * d.max_read_bytes(),
                  kLeastBatches * std::max(d.max_read_bytes(), d.read_post_bytes()));
}

Config DefaultConfig() {
  Config config = EmbeddedConfig();
  ResolveAutomatic(&config);
  return config;
}

absl::StatusOr<Config> LoadConfig(std::string_view text) {
  Config config = EmbeddedConfig();
  const std::vector<internal::FieldMention> fields =
      internal::ScanFields(text, Config::descriptor());
  FirstErrorCollector errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  // Merge, not Parse: fields set in `text` overwrite the defaults, zero values included.
  if (!parser.MergeFromString(std::string(text), &config)) return errors.ToStatus(fields);
  RETURN_IF_ERROR(RefuseRepeatedSingularFields(fields));
  ResolveAutomatic(&config);
  RETURN_IF_ERROR(ValidateConfig(config));
  return config;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadConfigFile(path));
  absl::StatusOr<Config> config = LoadConfig(text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::Status ValidateConfig(const Config& c) {
  RETURN_IF_ERROR(CheckAbsolutePath("state_dir", c.state_dir()));
  RETURN_IF_ERROR(ValidateListen(c.listen()));
  RETURN_IF_ERROR(ValidatePool(c.pool()));
  RETURN_IF_ERROR(ValidateIo(c.io()));
  RETURN_IF_ERROR(ValidateDram(c.dram(), c.pool()));
  RETURN_IF_ERROR(ValidateLimits(c.limits(), c.pool()));
  RETURN_IF_ERROR(
      CheckRange("journal.checkpoint_every", c.journal().checkpoint_every(), 1, 1u << 30));
  RETURN_IF_ERROR(ValidateGpu(c.gpu()));
  RETURN_IF_ERROR(ValidateDatapath(c.datapath()));
  RETURN_IF_ERROR(ValidateDecision(c.datapath()));
  RETURN_IF_ERROR(ValidateWriteBacklog(c.datapath(), c.limits(), c.pool()));
  RETURN_IF_ERROR(ValidateMetrics(c.metrics()));
  RETURN_IF_ERROR(
      CheckOneOf("security.namespace_sharing", c.security().namespace_sharing(), {"user", "host"}));
  return CheckOneOf("log_level", c.log_level(), {"trace", "debug", "info", "warn", "error"});
}

std::string RenderConfig(const Config& config) {
  std::string out;
  PrintMessage(config, 0, &out);
  return out;
}

}  // namespace tutti::config
