// tuttid's configuration: the embedded default (config/default.textproto), loading a text-proto
// config file on top of it, and validation.
//
// A config is read once at start-up, validated, logged (RenderConfig) and passed down explicitly;
// nothing here is global or mutable. Every rejected value stops start-up with INVALID_ARGUMENT
// naming the field and the allowed range.
//
// Thread-safety: every function is pure and thread-safe.
#ifndef TUTTI_CONFIG_CONFIG_H_
#define TUTTI_CONFIG_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tutti/v1/config.pb.h"

namespace tutti::config {

// The largest number of objects one pool slot may hold (its header has one checksum per object).
// Equal to pool::kMaxObjectsPerSlot; daemon/main.cc asserts that.
inline constexpr uint32_t kMaxObjectsPerSlot = 496;
// The largest pool.extent_slots (0 is automatic). Equal to pool::kMaxExtentSlots; daemon/main.cc
// asserts that.
inline constexpr uint32_t kMaxExtentSlots = 4096;

// The text of config/default.textproto, embedded in the binary. Lives forever.
std::string_view DefaultConfigText();

// The operator API's socket: listen.admin_socket_path, or socket_path + ".admin" when empty.
// tuttictl derives it the same way from its --socket.
std::string AdminSocketPath(const tutti::v1::ListenConfig& listen);

// Returns the embedded default config with its automatic fields resolved as LoadConfig("") does,
// unvalidated (it is valid: config_test checks it).
tutti::v1::Config DefaultConfig();

// The bytes of one host bounce slot: max(datapath.read_post_bytes, max_read_bytes), rounded up to
// 4 KiB (one batch of a device's reads lands in one slot and is copied to the GPU in one go).
uint64_t ReadBounceSlotBytes(const tutti::v1::Config& config);

// The host bounce slots per pool device that Retrieves staged on the GPU read into:
// datapath.read_bounce_depth where set, else 64 MiB of slots shared out over pool.dirs, at least
// 8 MiB and 2 slots each (with 4 MiB slots: 16 at one device, 4 at four, 2 at eight; with 1 MiB
// slots: 64, 16, 8), at most 1024.
uint32_t ReadBounceDepth(const tutti::v1::Config& config);

// Per pool device, the bytes of Retrieve reads in flight at once: datapath.max_read_bytes_in_flight
// where not 0, else what the device's queue holds (io.queue_depth x max_read_bytes) and at least
// 16 whole batches (x max(max_read_bytes, read_post_bytes)): the scheduler counts a batch's bytes
// until its last read completes, so a few large batches would leave the device idle behind each
// one's slowest read.
uint64_t MaxReadBytesInFlight(const tutti::v1::Config& config);

// Parses `text` (a text-format tutti.v1.Config, possibly empty) on top of the embedded defaults:
// every field `text` sets replaces the default, including zero values; `pool.dirs` given in
// `text` replace the (empty) default list. Then resolves the fields whose 0 means automatic:
// limits.store_staging_bytes and limits.retrieve_staging_bytes become 256 MiB per pool device
// (pool.dirs, or io.nvme_devices / io.passthrough_devices for those backends; at least one),
// within [256 MiB, 1 GiB], and never less than validation asks. Then validates the result
// (ValidateConfig).
// Errors, all INVALID_ARGUMENT:
//  - "line <l>, column <c>: <field path>: <what>" for parse errors and unknown fields (the path,
//    e.g. "pool.object_bytes", is left out where the error is before any field name);
//  - "line <l>, column <c>: <field path> is given twice (first at ...)" for a field that is not a
//    list given more than once, sub-messages included ("pool { } pool { }");
//  - ValidateConfig's error.
absl::StatusOr<tutti::v1::Config> LoadConfig(std::string_view text);

// Reads the config file at `path` (which must be a regular file of at most 1 MiB) and loads it as
// LoadConfig does. Every error names `path`: NOT_FOUND (no such file), PERMISSION_DENIED,
// FAILED_PRECONDITION (not a regular file, e.g. a directory or a FIFO; a read error), each
// "cannot read config <path>: <what>: <strerror>"; INVALID_ARGUMENT "<path>: " + LoadConfig's
// error, or for a file larger than 1 MiB.
absl::StatusOr<tutti::v1::Config> LoadConfigFile(const std::string& path);

// Checks every field against its allowed range and the fields against each other. Returns the first
// problem as INVALID_ARGUMENT "<field path> = <value>: <allowed range>", e.g.
// "pool.object_bytes = 1000: must be a multiple of 4096 in [4096, 67108864]".
absl::Status ValidateConfig(const tutti::v1::Config& config);

// The config as multi-line text format (what a config file holding every field would say), for the
// start-up log and --print_default_config.
std::string RenderConfig(const tutti::v1::Config& config);

}  // namespace tutti::config

#endif  // TUTTI_CONFIG_CONFIG_H_
