#include "daemon/server/device_health.h"

#include "absl/strings/str_join.h"
#include "common/log.h"

namespace tutti::server {

std::string CriticalWarningText(uint32_t bits) {
  static const char* const kBits[] = {
      "available spare below threshold", "temperature out of range",
      "reliability degraded (media or internal errors)", "read-only",
      "volatile memory backup failed", "persistent memory region read-only"};
  std::vector<std::string> words;
  for (int i = 0; i < 6; ++i) {
    if (bits & (1u << i)) words.push_back(kBits[i]);
  }
  if (bits >> 6) words.push_back("unknown bits");
  return words.empty() ? "none" : absl::StrJoin(words, ", ");
}

void DeviceHealthBoard::Update(const std::vector<DeviceHealth>& devices) {
  auto log = log::Get("health");
  absl::MutexLock lock(&mu_);
  for (const DeviceHealth& d : devices) {
    auto it = devices_.find(d.device);
    const uint32_t before = it == devices_.end() ? 0 : it->second.critical_warning;
    if (d.critical_warning != before && d.critical_warning != 0) {
      log->warn("{} ({}, serial {}): NVMe critical warning 0x{:02x}: {} (temperature {} C, spare "
                "{}%, {}% of endurance used, {} media errors)",
                d.device, d.model, d.serial, d.critical_warning,
                CriticalWarningText(d.critical_warning), d.temperature_c, d.available_spare_pct,
                d.percentage_used, d.media_errors);
    } else if (d.critical_warning == 0 && before != 0) {
      log->info("{} ({}, serial {}): NVMe critical warning cleared", d.device, d.model, d.serial);
    }
    devices_[d.device] = d;
  }
}

std::vector<DeviceHealth> DeviceHealthBoard::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<DeviceHealth> out;
  for (const auto& [name, d] : devices_) out.push_back(d);
  return out;
}

}  // namespace tutti::server
