// tuttictl devices: the NVMe controllers and namespaces behind the pool directories.
//
// Runs in tuttictl, not in tuttid: the identify and SMART admin commands need root, and tuttid
// runs as user tutti. The pool directories come from tuttid's Status (or --dirs, without a
// daemon); sysfs gives the device, libnvme the health (devices.h).
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/tuttictl/admin_call.h"
#include "client/tuttictl/command.h"
#include "client/tuttictl/devices.h"
#include "client/tuttictl/output.h"
#include "common/status_macros.h"

namespace tutti::tuttictl {
namespace {

namespace v1 = tutti::v1;

// One pool directory's answer: its device, and per NVMe disk its health or why there is none.
struct DirReport {
  std::string dir;
  absl::StatusOr<DirDevice> device;
  std::vector<absl::StatusOr<NvmeHealth>> health;  // per disk; only NVMe disks are read
};

std::string WarningText(uint8_t bits) {
  if (bits == 0) return "none";
  return absl::StrCat("0x", absl::Hex(bits, absl::kZeroPad2), ": ",
                      absl::StrJoin(CriticalWarnings(bits), ", "));
}

void HumanDisk(const Disk& d, const absl::StatusOr<NvmeHealth>& h, KeyValues* kv) {
  kv->Add("  namespace", absl::StrCat(d.name, " (nsid ", d.nsid, ", ", HumanBytes(d.capacity_bytes),
                                      ") of controller ", d.controller));
  kv->Add("    model", d.model);
  kv->Add("    serial", d.serial);
  kv->Add("    firmware", d.firmware);
  kv->Add("    transport", absl::StrCat(d.transport, " ", d.address));
  if (!h.ok()) {
    kv->Add("    health", absl::StrCat("unavailable: ", h.status().message()));
    return;
  }
  kv->Add("    capacity", absl::StrCat(HumanBytes(h->namespace_bytes), " (",
                                       HumanBytes(h->namespace_used_bytes), " in use)"));
  kv->Add("    temperature", absl::StrCat(h->temperature_c, " C"));
  kv->Add("    spare", absl::StrCat(h->available_spare_pct, "% (threshold ",
                                    h->spare_threshold_pct, "%)"));
  kv->Add("    wear", absl::StrCat(h->percentage_used, "% of rated endurance used"));
  kv->Add("    media errors", absl::StrCat(h->media_errors));
  kv->Add("    power-on hours", absl::StrCat(h->power_on_hours));
  kv->Add("    unsafe shutdowns", absl::StrCat(h->unsafe_shutdowns));
  kv->Add("    critical warning", WarningText(h->critical_warning));
}

void JsonDisk(const Disk& d, const absl::StatusOr<NvmeHealth>& h, JsonWriter& j) {
  j.BeginObject().Key("name").String(d.name).Key("kind").String(d.kind);
  j.Key("capacity_bytes").Uint(d.capacity_bytes).Key("nvme").Bool(d.nvme);
  if (d.nvme) {
    j.Key("nsid").Uint(d.nsid).Key("controller").String(d.controller);
    j.Key("model").String(d.model).Key("serial").String(d.serial);
    j.Key("firmware").String(d.firmware).Key("transport").String(d.transport);
    j.Key("address").String(d.address);
    if (h.ok()) {
      j.Key("health").BeginObject();
      j.Key("model").String(h->model).Key("serial").String(h->serial);
      j.Key("firmware").String(h->firmware);
      j.Key("namespace_bytes").Uint(h->namespace_bytes);
      j.Key("namespace_used_bytes").Uint(h->namespace_used_bytes);
      j.Key("temperature_c").Double(h->temperature_c);
      j.Key("available_spare_pct").Uint(h->available_spare_pct);
      j.Key("spare_threshold_pct").Uint(h->spare_threshold_pct);
      j.Key("percentage_used").Uint(h->percentage_used);
      j.Key("media_errors").Uint(h->media_errors);
      j.Key("power_on_hours").Uint(h->power_on_hours);
      j.Key("unsafe_shutdowns").Uint(h->unsafe_shutdowns);
      j.Key("critical_warning").Uint(h->critical_warning);
      j.Key("critical_warnings").BeginArray();
      for (const std::string& w : CriticalWarnings(h->critical_warning)) j.String(w);
      j.EndArray().EndObject();
    } else {
      j.Key("health_error").String(std::string(h.status().message()));
    }
  }
  j.EndObject();
}

class DevicesCommand : public Command {
 public:
  std::string name() const override { return "devices"; }
  std::string usage() const override { return "devices [--dirs DIR,DIR...] [--report]"; }
  std::string summary() const override {
    return "the NVMe controllers and namespaces behind the pool: model, serial, firmware, "
           "capacity, SMART health (root needed for SMART)";
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.String("dirs", &dirs_, "pool directories, comma-separated (default: tuttid's status)");
    flags.String("sysfs_root", &sysfs_root_, "where sysfs is mounted");
    flags.String("dev_root", &dev_root_, "where the NVMe controllers' device nodes are");
    flags.Bool("report", &report_,
               "also send the health read to tuttid (ReportDevices), which logs a critical "
               "warning and exports tutti_nvme_* metrics (tuttid cannot read SMART logs itself)");
  }
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override {
    std::vector<std::string> dirs = absl::StrSplit(dirs_, ',', absl::SkipEmpty());
    if (dirs.empty()) {
      v1::StatusResponse st;
      RETURN_IF_ERROR(CallAdmin(options, &v1::Admin::Stub::Status, v1::StatusRequest(), &st));
      dirs.assign(st.pool_dirs().begin(), st.pool_dirs().end());
    }
    std::vector<DirReport> reports;
    for (const std::string& dir : dirs) reports.push_back(Inspect(dir));
    options.json ? PrintJson(reports, out) : PrintHuman(reports, out);
    std::vector<std::string> failed;
    for (const DirReport& r : reports) {
      if (!r.device.ok()) failed.push_back(r.dir);
    }
    if (report_) RETURN_IF_ERROR(Report(options, reports));
    if (!failed.empty()) {
      return absl::NotFoundError(absl::StrCat("cannot inspect ", absl::StrJoin(failed, ", ")));
    }
    return absl::OkStatus();
  }

 private:
  // Sends the health of every NVMe disk read (once per disk) to tuttid.
  static absl::Status Report(const GlobalOptions& options, const std::vector<DirReport>& reports) {
    v1::ReportDevicesRequest req;
    absl::flat_hash_set<std::string> seen;
    for (const DirReport& r : reports) {
      if (!r.device.ok()) continue;
      for (size_t i = 0; i < r.device->disks.size(); ++i) {
        const Disk& d = r.device->disks[i];
        if (!d.nvme || !r.health[i].ok() || !seen.insert(d.name).second) continue;
        const NvmeHealth& h = *r.health[i];
        v1::NvmeDeviceHealth* out = req.add_devices();
        out->set_device(d.name);
        out->set_model(h.model);
        out->set_serial(h.serial);
        out->set_critical_warning(h.critical_warning);
        out->set_temperature_c(h.temperature_c);
        out->set_available_spare_pct(h.available_spare_pct);
        out->set_percentage_used(h.percentage_used);
        out->set_media_errors(h.media_errors);
      }
    }
    if (req.devices_size() == 0) {
      return absl::FailedPreconditionError(
          "--report: no NVMe health was read (not on NVMe, or not root)");
    }
    v1::ReportDevicesResponse resp;
    return CallAdmin(options, &v1::Admin::Stub::ReportDevices, req, &resp);
  }

  DirReport Inspect(const std::string& dir) const {
    DirReport r{dir, DeviceOfDir(dir, sysfs_root_), {}};
    if (!r.device.ok()) return r;
    for (const Disk& d : r.device->disks) {
      r.health.push_back(d.nvme && !d.controller.empty()
                             ? ReadNvmeHealth(dev_root_, d.controller, d.nsid)
                             : absl::StatusOr<NvmeHealth>(absl::NotFoundError("not NVMe")));
    }
    return r;
  }

  static void PrintHuman(const std::vector<DirReport>& reports, std::ostream& out) {
    for (const DirReport& r : reports) {
      out << r.dir << "\n";
      if (!r.device.ok()) {
        out << "  error: " << r.device.status().message() << "\n";
        continue;
      }
      const DirDevice& dev = *r.device;
      KeyValues kv;
      kv.Add("  device", absl::StrCat(dev.major, ":", dev.minor, " ",
                                      dev.block_device.empty() ? "-" : dev.block_device));
      for (size_t i = 0; i < dev.disks.size(); ++i) {
        if (dev.disks[i].nvme) HumanDisk(dev.disks[i], r.health[i], &kv);
      }
      out << kv.Render();
      if (!dev.not_nvme.empty()) out << "  " << dev.not_nvme << "\n";
    }
  }

  static void PrintJson(const std::vector<DirReport>& reports, std::ostream& out) {
    JsonWriter j;
    j.BeginObject().Key("dirs").BeginArray();
    for (const DirReport& r : reports) {
      j.BeginObject().Key("dir").String(r.dir);
      if (!r.device.ok()) {
        j.Key("error").String(std::string(r.device.status().message())).EndObject();
        continue;
      }
      const DirDevice& dev = *r.device;
      j.Key("device").String(absl::StrCat(dev.major, ":", dev.minor));
      j.Key("block_device").String(dev.block_device);
      j.Key("nvme").Bool(dev.not_nvme.empty()).Key("not_nvme").String(dev.not_nvme);
      j.Key("disks").BeginArray();
      for (size_t i = 0; i < dev.disks.size(); ++i) JsonDisk(dev.disks[i], r.health[i], j);
      j.EndArray().EndObject();
    }
    j.EndArray().EndObject();
    out << j.str() << "\n";
  }

  std::string dirs_;
  std::string sysfs_root_ = "/sys";
  bool report_ = false;
  std::string dev_root_ = "/dev";
};

}  // namespace

std::unique_ptr<Command> NewDevicesCommand() { return std::make_unique<DevicesCommand>(); }

}  // namespace tutti::tuttictl
