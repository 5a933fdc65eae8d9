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

void RegisterDeviceHealthStats(std::function<std::vector<DeviceHealth>()> devices,
                               stats::Registry* registry) {
  struct Field {
    const char* name;
    const char* help;
    double (*value)(const DeviceHealth&);
  };
  static const Field kFields[] = {
      {"tutti_nvme_critical_warning", "The SMART critical-warning bit field of a pool device "
       "(0: none), as last reported by tuttictl devices --report.",
       [](const DeviceHealth& d) { return double(d.critical_warning); }},
      {"tutti_nvme_temperature_celsius", "Composite temperature of a pool device.",
       [](const DeviceHealth& d) { return double(d.temperature_c); }},
      {"tutti_nvme_available_spare_ratio", "Available spare capacity of a pool device (0..1).",
       [](const DeviceHealth& d) { return d.available_spare_pct / 100.0; }},
      {"tutti_nvme_endurance_used_ratio", "Share of its rated endurance a pool device has used "
       "(may pass 1).", [](const DeviceHealth& d) { return d.percentage_used / 100.0; }},
      {"tutti_nvme_media_errors", "Media and data integrity errors a pool device has counted.",
       [](const DeviceHealth& d) { return double(d.media_errors); }},
  };
  auto& g = registry->AddGroup<std::vector<DeviceHealth>>(std::move(devices));
  for (const Field& f : kFields) {
    g.Add({f.name, f.help, stats::Type::kGauge, {"device", "serial", "model"}},
          [value = f.value](const std::vector<DeviceHealth>& ds, stats::Samples* out) {
            for (const DeviceHealth& d : ds) out->Add({d.device, d.serial, d.model}, value(d));
          });
  }
}

}  // namespace tutti::server
