#include "client/tuttictl/devices.h"

#include <fcntl.h>
#include <libnvme.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <endian.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tutti::tuttictl {
namespace {

namespace fs = std::filesystem;

// A sysfs attribute, trimmed; "" if absent.
std::string Attr(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return "";
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return std::string(absl::StripAsciiWhitespace(s));
}

uint64_t AttrU64(const fs::path& p) {
  uint64_t v = 0;
  return absl::SimpleAtoi(Attr(p), &v) ? v : 0;
}

// The target of symlink `p` made canonical; empty if it does not resolve.
fs::path Resolve(const fs::path& p) {
  std::error_code ec;
  fs::path out = fs::canonical(p, ec);
  return ec ? fs::path() : out;
}

std::string DriverOf(const fs::path& disk_dir) {
  const fs::path driver = Resolve(disk_dir / "device" / "driver");
  return driver.empty() ? "" : driver.filename().string();
}

std::string KindOf(const std::string& name, const std::string& driver) {
  if (driver == "virtio_blk" || absl::StartsWith(name, "vd")) return "virtio block device";
  if (driver == "sd" || absl::StartsWith(name, "sd")) return "SCSI/SATA disk";
  if (absl::StartsWith(name, "xvd")) return "Xen block device";
  if (absl::StartsWith(name, "loop")) return "loop device";
  if (absl::StartsWith(name, "nbd")) return "network block device";
  if (absl::StartsWith(name, "zram") || absl::StartsWith(name, "ram")) return "RAM disk";
  if (absl::StartsWith(name, "mmcblk")) return "MMC device";
  return "block device";
}

// The controller directory of NVMe namespace `disk_dir`: its `device` link, or for a multipath
// namespace (device -> nvme-subsysN) the first controller under the subsystem.
fs::path ControllerDir(const fs::path& disk_dir) {
  const fs::path device = Resolve(disk_dir / "device");
  if (device.empty() || !absl::StartsWith(device.filename().string(), "nvme-subsys")) return device;
  static const std::regex kCtrl("nvme[0-9]+");
  std::error_code ec;
  std::vector<std::string> ctrls;
  for (const auto& e : fs::directory_iterator(device, ec)) {
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, kCtrl)) ctrls.push_back(n);
  }
  if (ctrls.empty()) return fs::path();
  std::sort(ctrls.begin(), ctrls.end());
  return Resolve(device / ctrls.front());
}

void DescribeNvme(const fs::path& disk_dir, Disk* d) {
  d->nvme = true;
  d->kind = "NVMe namespace";
  d->nsid = static_cast<uint32_t>(AttrU64(disk_dir / "nsid"));
  if (d->nsid == 0) {  // older kernels: nvmeXnN names namespace N
    const size_t n = d->name.rfind('n');
    uint32_t id = 0;
    if (n != std::string::npos && absl::SimpleAtoi(d->name.substr(n + 1), &id)) d->nsid = id;
  }
  const fs::path ctrl = ControllerDir(disk_dir);
  if (ctrl.empty()) return;
  d->controller = ctrl.filename().string();
  d->model = Attr(ctrl / "model");
  d->serial = Attr(ctrl / "serial");
  d->firmware = Attr(ctrl / "firmware_rev");
  d->transport = Attr(ctrl / "transport");
  d->address = Attr(ctrl / "address");
}

// Appends the disks beneath `dir` (a disk, or a dm/md device with slaves) to `out`.
void CollectDisks(const fs::path& sysfs_root, const fs::path& dir, int depth,
                  std::vector<Disk>* out) {
  std::error_code ec;
  std::vector<std::string> slaves;
  for (const auto& e : fs::directory_iterator(dir / "slaves", ec)) {
    slaves.push_back(e.path().filename().string());
  }
  if (!slaves.empty() && depth < 8) {
    std::sort(slaves.begin(), slaves.end());
    for (const std::string& s : slaves) {
      fs::path slave = Resolve(sysfs_root / "class" / "block" / s);
      if (slave.empty()) continue;
      if (fs::exists(slave / "partition")) slave = slave.parent_path();
      CollectDisks(sysfs_root, slave, depth + 1, out);
    }
    return;
  }
  Disk d;
  d.name = dir.filename().string();
  d.capacity_bytes = AttrU64(dir / "size") * 512;
  static const std::regex kNvmeNamespace("nvme[0-9]+(c[0-9]+)?n[0-9]+");
  if (std::regex_match(d.name, kNvmeNamespace)) {
    DescribeNvme(dir, &d);
  } else {
    d.kind = KindOf(d.name, DriverOf(dir));
  }
  out->push_back(std::move(d));
}

std::string NotNvmeText(const DirDevice& dev) {
  if (dev.block_device.empty()) {
    return absl::StrCat("not on a block device (device ", dev.major, ":", dev.minor,
                        ": tmpfs, overlay or another virtual file system)");
  }
  std::vector<std::string> others;
  for (const Disk& d : dev.disks) {
    if (!d.nvme) others.push_back(absl::StrCat(d.kind, " ", d.name));
  }
  if (others.empty() && !dev.disks.empty()) return "";
  if (dev.disks.empty()) return absl::StrCat("not on NVMe (", dev.block_device, ", no disk found)");
  const bool some = others.size() < dev.disks.size();
  return absl::StrCat(some ? "partly " : "", "not on NVMe (", absl::StrJoin(others, ", "), ")");
}

uint64_t Le128Low(const uint8_t* b) {
  uint64_t lo = 0, hi = 0;
  for (int i = 7; i >= 0; --i) lo = (lo << 8) | b[i];
  for (int i = 15; i >= 8; --i) hi = (hi << 8) | b[i];
  return hi != 0 ? UINT64_MAX : lo;
}

// An admin command's result as a status: < 0 is -1 with errno, > 0 an NVMe status code.
absl::Status CommandStatus(int rc, const std::string& what, const std::string& path) {
  if (rc == 0) return absl::OkStatus();
  if (rc < 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(absl::StrCat(what, " on ", path, ": ", strerror(err),
                                                      "; NVMe admin commands need root (sudo)"));
    }
    return absl::UnavailableError(absl::StrCat(what, " on ", path, ": ", strerror(err)));
  }
  return absl::UnavailableError(
      absl::StrCat(what, " on ", path, ": NVMe status 0x", absl::Hex(rc)));
}

}  // namespace

absl::StatusOr<DirDevice> ResolveBlockDevice(const std::string& sysfs_root, uint32_t major,
                                             uint32_t minor) {
  DirDevice dev;
  dev.major = major;
  dev.minor = minor;
  const fs::path root(sysfs_root);
  const fs::path link = root / "dev" / "block" / absl::StrCat(major, ":", minor);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(link, ec))) {
    dev.not_nvme = NotNvmeText(dev);
    return dev;
  }
  fs::path dir = Resolve(link);
  if (dir.empty()) {
    return absl::InternalError(absl::StrCat("cannot resolve ", link.string(), ": ",
                                            strerror(errno)));
  }
  dev.block_device = dir.filename().string();
  if (fs::exists(dir / "partition")) dir = dir.parent_path();
  CollectDisks(root, dir, 0, &dev.disks);
  dev.not_nvme = NotNvmeText(dev);
  return dev;
}

absl::StatusOr<DirDevice> DeviceOfDir(const std::string& dir, const std::string& sysfs_root) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("stat ", dir, ": ", strerror(errno)));
  }
  auto dev = ResolveBlockDevice(sysfs_root, major(st.st_dev), minor(st.st_dev));
  if (dev.ok()) dev->dir = dir;
  return dev;
}

absl::StatusOr<NvmeHealth> ReadNvmeHealth(const std::string& dev_root,
                                          const std::string& controller, uint32_t nsid) {
  const std::string path = absl::StrCat(dev_root, "/", controller);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(absl::StrCat(
          "open ", path, ": ", strerror(err),
          "; identify and SMART need root (run sudo tuttictl devices)"));
    }
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("open ", path, ": ", strerror(err)));
    return absl::UnavailableError(absl::StrCat("open ", path, ": ", strerror(err)));
  }
  NvmeHealth h;
  absl::Status status;
  struct nvme_id_ctrl id;
  memset(&id, 0, sizeof(id));
  status = CommandStatus(nvme_identify_ctrl(fd, &id), "identify controller", path);
  if (status.ok()) {
    h.model = std::string(absl::StripAsciiWhitespace(absl::string_view(id.mn, sizeof(id.mn))));
    h.serial = std::string(absl::StripAsciiWhitespace(absl::string_view(id.sn, sizeof(id.sn))));
    h.firmware = std::string(absl::StripAsciiWhitespace(absl::string_view(id.fr, sizeof(id.fr))));
    struct nvme_id_ns ns;
    memset(&ns, 0, sizeof(ns));
    status = CommandStatus(nvme_identify_ns(fd, nsid, &ns), "identify namespace", path);
    if (status.ok()) {
      const uint32_t ds = ns.lbaf[ns.flbas & 0xf].ds;
      const uint64_t block = ds >= 9 && ds < 32 ? (uint64_t{1} << ds) : 512;
      h.namespace_bytes = le64toh(ns.nsze) * block;
      h.namespace_used_bytes = le64toh(ns.nuse) * block;
    }
  }
  if (status.ok()) {
    struct nvme_smart_log log;
    memset(&log, 0, sizeof(log));
    status = CommandStatus(nvme_get_log_smart(fd, NVME_NSID_ALL, false, &log), "SMART log", path);
    if (status.ok()) {
      h.critical_warning = log.critical_warning;
      const int kelvin = log.temperature[0] | (log.temperature[1] << 8);
      h.temperature_c = kelvin - 273;
      h.available_spare_pct = log.avail_spare;
      h.spare_threshold_pct = log.spare_thresh;
      h.percentage_used = log.percent_used;
      h.media_errors = Le128Low(log.media_errors);
      h.power_on_hours = Le128Low(log.power_on_hours);
      h.unsafe_shutdowns = Le128Low(log.unsafe_shutdowns);
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return h;
}

std::vector<std::string> CriticalWarnings(uint8_t bits) {
  static const char* const kBits[] = {
      "available spare below threshold",
      "temperature out of range",
      "reliability degraded (media or internal errors)",
      "media in read-only mode",
      "volatile memory backup failed",
      "persistent memory region read-only",
  };
  std::vector<std::string> out;
  for (int b = 0; b < 8; ++b) {
    if ((bits >> b) & 1) out.push_back(b < 6 ? kBits[b] : absl::StrCat("reserved bit ", b));
  }
  return out;
}

}  // namespace tutti::tuttictl
