// NVMe health of the pool's devices as last reported by a privileged reader.
//
// tuttid runs unprivileged, and reading an NVMe SMART log takes CAP_SYS_ADMIN on Debian 12's
// kernel, so tuttid does not read it itself: `tuttictl devices --report`, run as root (the
// packaged tutti-health@.timer does so every minute), sends what it read through the admin
// API's ReportDevices. The board keeps the latest report per device, logs a warning naming the
// device and the warning bits when a device's critical warning turns non-zero or changes (and an
// info line when it clears), and serves the figures to the metrics endpoint.
//
// Thread-safety: every method may be called from any thread.
#ifndef TUTTI_DAEMON_SERVER_DEVICE_HEALTH_H_
#define TUTTI_DAEMON_SERVER_DEVICE_HEALTH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/synchronization/mutex.h"
#include "common/stats.h"

namespace tutti::server {

struct DeviceHealth {
  std::string device;  // e.g. "nvme0n1"
  std::string model, serial;
  uint32_t critical_warning = 0;  // the SMART log's bit field
  int32_t temperature_c = 0;
  uint32_t available_spare_pct = 0;
  uint32_t percentage_used = 0;
  uint64_t media_errors = 0;
  int64_t reported_ms = 0;  // when the report came (the daemon's clock)
};

// The SMART critical-warning bits in words ("spare below threshold, reliability degraded").
std::string CriticalWarningText(uint32_t bits);

class DeviceHealthBoard {
 public:
  // Replaces the entries of the reported devices (others stay). Logs as the header says.
  void Update(const std::vector<DeviceHealth>& devices);
  std::vector<DeviceHealth> Snapshot() const;

 private:
  mutable absl::Mutex mu_;
  absl::btree_map<std::string, DeviceHealth> devices_ ABSL_GUARDED_BY(mu_);
};

// NVMe health in the stats registry (common/stats.h): the tutti_nvme_* gauges, one sample per
// device of `devices` (DeviceHealthBoard::Snapshot, as `tuttictl devices --report` sent it); no
// samples until a report came.
void RegisterDeviceHealthStats(std::function<std::vector<DeviceHealth>()> devices,
                               stats::Registry* registry);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_DEVICE_HEALTH_H_
