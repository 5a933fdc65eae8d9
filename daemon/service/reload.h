// Config reload on SIGHUP: which settings change at run time, and applying them.
//
// The run-time settings (kRunTimeFields) take effect at once; every other field takes effect only
// at start: a change to one is refused, named in the log ("pool.capacity_bytes changed: it takes
// effect only at start; restart tuttid@0"), and keeps its running value, while the run-time
// changes of the same file still apply. An unreadable or invalid file changes nothing.
//
// Thread-safety: PlanReload is pure; Reload may be called from one thread at a time.
#ifndef TUTTI_DAEMON_SERVICE_RELOAD_H_
#define TUTTI_DAEMON_SERVICE_RELOAD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/store/block_store.h"
#include "tutti/v1/config.pb.h"

namespace tutti::service {

// The field paths that may change at run time.
inline constexpr const char* kRunTimeFields[] = {
    "log_level",
    "datapath.max_write_backlog_bytes",
    "datapath.max_write_backlog_age_ms",
};

struct ReloadPlan {
  tutti::v1::Config config;          // the running config with every run-time change applied
  std::vector<std::string> applied;  // one per run-time change: "log_level: \"info\" -> \"debug\""
  std::vector<std::string> refused;  // the start-up-only fields that changed, e.g. "pool.dirs"
};

// Compares `loaded` (a new effective config, validated) with `running`, field by field (a list
// compares as a whole: "pool.dirs"), in field-number order.
ReloadPlan PlanReload(const tutti::v1::Config& running, const tutti::v1::Config& loaded);

// The whole reload: logs why `loaded` is not used if it is an error; else plans, logs each applied
// and each refused change (naming `unit` in the advice to restart), sets the log level and the
// store's backlog bounds, and returns the config now in force (`running` where nothing applied).
// `store` must not be null when `loaded` is a config.
tutti::v1::Config Reload(const tutti::v1::Config& running,
                         const absl::StatusOr<tutti::v1::Config>& loaded, const std::string& unit,
                         store::BlockStore* store);

}  // namespace tutti::service

#endif  // TUTTI_DAEMON_SERVICE_RELOAD_H_
