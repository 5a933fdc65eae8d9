#include "daemon/io/nvme/vfio.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/pci_regs.h>
#include <linux/vfio.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cassert>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "daemon/io/nvme/iova_allocator.h"

namespace tutti::io::nvme {
namespace {

constexpr char kDocs[] = " (docs/nvme.md)";
constexpr uint64_t kPage = 4096;
constexpr uint64_t kHugePage = 2ull << 20;
constexpr uint32_t kNvmeClass = 0x010802;  // mass storage, non-volatile memory, NVMe

// "STEP PATH: strerror(errno)" with a code chosen from errno; `hint` appended when given.
absl::Status ErrnoStatus(int err, absl::string_view step, absl::string_view path,
                         absl::string_view hint = "") {
  std::string message = absl::StrCat(step, " ", path, ": ", std::strerror(err));
  if (!hint.empty()) absl::StrAppend(&message, ": ", hint);
  switch (err) {
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOENT:
    case ENODEV:
      return absl::NotFoundError(message);
    case EBUSY:
      return absl::UnavailableError(message);
    case ENOMEM:
    case ENOSPC:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// The last component of the symlink at `path` ("../../../kernel/iommu_groups/5" -> "5").
absl::StatusOr<std::string> LinkTarget(const std::string& path) {
  char buf[4096];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof(buf) - 1);
  if (n < 0) return ErrnoStatus(errno, "readlink", path);
  std::string target(buf, static_cast<size_t>(n));
  return target.substr(target.find_last_of('/') + 1);
}

// The driver bound to the PCI device at `dir`, "" when none.
std::string DriverOf(const std::string& dir) {
  auto driver = LinkTarget(dir + "/driver");
  return driver.ok() ? *driver : "";
}

bool ValidAddress(const std::string& a) {
  // dddd:bb:dd.f
  if (a.size() != 12 || a[4] != ':' || a[7] != ':' || a[10] != '.') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11}) {
    if (!std::isxdigit(static_cast<unsigned char>(a[i])) || std::isupper(a[i])) return false;
  }
  return true;
}

std::string DeviceDir(const VfioOptions& o) {
  return absl::StrCat(o.sysfs_root, "/bus/pci/devices/", o.pci_address);
}

absl::Status CheckNvmeClass(const std::string& dir) {
  std::ifstream in(dir + "/class");
  std::string text;
  uint32_t cls = 0;
  if (!(in >> text) || !absl::SimpleHexAtoi(text, &cls)) {
    return absl::FailedPreconditionError(absl::StrCat("read ", dir, "/class: no PCI class"));
  }
  if (cls != kNvmeClass) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": PCI class ", text, " is not an NVMe controller (0x010802)"));
  }
  return absl::OkStatus();
}

absl::Status CheckDriver(const VfioOptions& o) {
  const std::string driver = DriverOf(DeviceDir(o));
  if (driver == "vfio-pci") return absl::OkStatus();
  const std::string bind = absl::StrCat(": run tools/nvme_bind.sh bind ", o.pci_address, kDocs);
  if (driver.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(o.pci_address, " is bound to no driver, not vfio-pci", bind));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(o.pci_address, " is bound to ", driver, ", not vfio-pci", bind));
}

absl::StatusOr<int> IommuGroupOf(const VfioOptions& o) {
  const std::string link = DeviceDir(o) + "/iommu_group";
  auto group = LinkTarget(link);
  int n = -1;
  if (!group.ok() || !absl::SimpleAtoi(*group, &n)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "readlink ", link, ": no IOMMU group: the IOMMU is off or absent (boot with "
        "intel_iommu=on or amd_iommu=on; Debian's kernel has no vfio no-IOMMU mode)", kDocs));
  }
  return n;
}

// Every device of group `n` bound to a driver vfio accepts in a viable group.
absl::Status CheckGroupViable(const VfioOptions& o, int n) {
  const std::string dir = absl::StrCat(o.sysfs_root, "/kernel/iommu_groups/", n, "/devices");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "opendir", dir);
  std::vector<std::string> offending;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string driver = DriverOf(dir + "/" + name);
    if (driver.empty() || driver == "vfio-pci" || driver == "pci-stub" || driver == "pcieport") {
      continue;
    }
    offending.push_back(absl::StrCat(name, " (", driver, ")"));
  }
  ::closedir(d);
  if (offending.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "IOMMU group ", n, " is not viable: ", absl::StrJoin(offending, ", "),
      " not bound to vfio-pci; every device of the group must be", kDocs));
}

absl::Status CheckNode(const std::string& path, const char* missing_hint) {
  if (::access(path.c_str(), F_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(errno), ": ",
                                                      missing_hint, kDocs));
  }
  if (::access(path.c_str(), R_OK | W_OK) != 0) {
    return ErrnoStatus(errno, "access", path,
                       absl::StrCat("tuttid needs root or the vfio group's owner", kDocs));
  }
  return absl::OkStatus();
}

// Steps 1-2 and the nodes: what can be checked without opening the group.
absl::StatusOr<int> CheckAll(const VfioOptions& o) {
  if (!ValidAddress(o.pci_address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PCI address '", o.pci_address, "' is not of the form 0000:01:00.0 (lower-case hex)"));
  }
  const std::string dir = DeviceDir(o);
  if (::access(dir.c_str(), F_OK) != 0) {
    return ErrnoStatus(errno, "stat", dir, "no such PCI device (lspci -D lists them)");
  }
  RETURN_IF_ERROR(CheckNvmeClass(dir));
  RETURN_IF_ERROR(CheckDriver(o));
  ASSIGN_OR_RETURN(const int group, IommuGroupOf(o));
  RETURN_IF_ERROR(CheckGroupViable(o, group));
  RETURN_IF_ERROR(CheckNode(o.dev_root + "/vfio/vfio", "no vfio: modprobe vfio-pci"));
  RETURN_IF_ERROR(CheckNode(absl::StrCat(o.dev_root, "/vfio/", group),
                            "no vfio group node: is the device bound to vfio-pci?"));
  return group;
}

// The type1 container and the group in it, shared by the device and every DmaBuffer so that the
// IOMMU mappings can be removed whichever goes last.
struct Container {
  UniqueFd container;
  UniqueFd group;
  std::string group_path;
  absl::Mutex mu;
  IovaAllocator iova ABSL_GUARDED_BY(mu);
  size_t mapped ABSL_GUARDED_BY(mu) = 0;

  Container(uint64_t begin, uint64_t end) : iova(begin, end, kPage) {}
  ~Container() {
    if (group.valid()) ::ioctl(group.get(), VFIO_GROUP_UNSET_CONTAINER);
  }

  absl::StatusOr<uint64_t> Map(void* host, size_t length) {
    absl::MutexLock lock(&mu);
    const std::optional<uint64_t> at = iova.Allocate(length);
    if (!at) {
      return absl::ResourceExhaustedError(
          absl::StrCat("IOVA space of ", group_path, " exhausted mapping ", length, " bytes"));
    }
    vfio_iommu_type1_dma_map map = {};
    map.argsz = sizeof(map);
    map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
    map.vaddr = reinterpret_cast<uintptr_t>(host);
    map.iova = *at;
    map.size = length;
    if (::ioctl(container.get(), VFIO_IOMMU_MAP_DMA, &map) != 0) {
      const int err = errno;
      iova.Free(*at, length);
      absl::Status s = ErrnoStatus(err, "VFIO_IOMMU_MAP_DMA on container of", group_path,
                                   "pinned memory counts against RLIMIT_MEMLOCK without "
                                   "CAP_IPC_LOCK (docs/nvme.md)");
      return absl::ResourceExhaustedError(s.message());
    }
    mapped += length;
    return *at;
  }

  void Unmap(uint64_t at, size_t length) {
    absl::MutexLock lock(&mu);
    vfio_iommu_type1_dma_unmap unmap = {};
    unmap.argsz = sizeof(unmap);
    unmap.iova = at;
    unmap.size = length;
    // A failure leaves the range mapped: it is then not handed out again.
    if (::ioctl(container.get(), VFIO_IOMMU_UNMAP_DMA, &unmap) != 0) return;
    iova.Free(at, length);
    mapped -= length;
  }
};

class VfioBuffer final : public DmaBuffer {
 public:
  VfioBuffer(std::shared_ptr<Container> c, uint8_t* host, uint64_t iova, size_t size,
             size_t mapped, bool owned)
      : c_(std::move(c)), host_(host), iova_(iova), size_(size), mapped_(mapped), owned_(owned) {}
  ~VfioBuffer() override {
    c_->Unmap(iova_, mapped_);
    if (owned_) ::munmap(host_, mapped_);
  }
  uint8_t* host() const override { return host_; }
  uint64_t iova() const override { return iova_; }
  size_t size() const override { return size_; }

 private:
  std::shared_ptr<Container> c_;
  uint8_t* host_;
  uint64_t iova_;
  size_t size_, mapped_;
  bool owned_;
};

class VfioDma final : public DmaAllocator {
 public:
  VfioDma(std::shared_ptr<Container> c, bool hugepages) : c_(std::move(c)), huge_(hugepages) {}

  absl::StatusOr<std::unique_ptr<DmaBuffer>> Allocate(size_t size) override {
    const size_t rounded = (size + kPage - 1) & ~(kPage - 1);
    size_t length = rounded;
    void* p = MAP_FAILED;
    if (huge_ && rounded >= kHugePage) {
      length = (rounded + kHugePage - 1) & ~(kHugePage - 1);
      p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    }
    if (p == MAP_FAILED) {  // no hugepages asked for, or none free: normal pages
      length = rounded;
      p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("mmap of ", length, " bytes of DMA memory: ", std::strerror(errno)));
    }
    if (::mlock(p, length) != 0) {
      const int err = errno;
      ::munmap(p, length);
      return absl::ResourceExhaustedError(absl::StrCat(
          "mlock of ", length, " bytes of DMA memory: ", std::strerror(err),
          ": raise RLIMIT_MEMLOCK (LimitMEMLOCK=) or give CAP_IPC_LOCK", kDocs));
    }
    auto at = c_->Map(p, length);
    if (!at.ok()) {
      ::munmap(p, length);
      return at.status();
    }
    return std::make_unique<VfioBuffer>(c_, static_cast<uint8_t*>(p), *at, rounded, length,
                                        /*owned=*/true);
  }

  absl::StatusOr<std::unique_ptr<DmaBuffer>> Map(uint8_t* memory, size_t size) override {
    if (reinterpret_cast<uintptr_t>(memory) % kPage != 0 || size == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("DMA map of ", size, " bytes at ", absl::Hex(reinterpret_cast<uintptr_t>(memory)),
                       ": memory must be page-aligned and not empty"));
    }
    const size_t length = (size + kPage - 1) & ~(kPage - 1);
    ASSIGN_OR_RETURN(const uint64_t at, c_->Map(memory, length));
    return std::make_unique<VfioBuffer>(c_, memory, at, size, length, /*owned=*/false);
  }

 private:
  std::shared_ptr<Container> c_;
  bool huge_;
};

class VfioBar final : public RegisterSpace {
 public:
  VfioBar(volatile uint8_t* base, size_t size) : base_(base), size_(size) {}
  ~VfioBar() override { ::munmap(const_cast<uint8_t*>(base_), size_); }
  size_t size() const override { return size_; }
  uint32_t Read32(size_t offset) const override { return *At<uint32_t>(offset); }
  uint64_t Read64(size_t offset) const override { return *At<uint64_t>(offset); }
  void Write32(size_t offset, uint32_t value) override { *At<uint32_t>(offset) = value; }
  void Write64(size_t offset, uint64_t value) override { *At<uint64_t>(offset) = value; }
  volatile uint32_t* DoorbellAddress(size_t offset) override { return At<uint32_t>(offset); }

 private:
  template <typename T>
  volatile T* At(size_t offset) const {
    assert(offset % sizeof(T) == 0 && offset + sizeof(T) <= size_);
    return reinterpret_cast<volatile T*>(base_ + offset);
  }
  volatile uint8_t* base_;
  size_t size_;
};

}  // namespace

struct VfioDevice::Parts {
  VfioOptions options;
  int group = -1;
  std::shared_ptr<Container> container;
  UniqueFd device;
  std::string device_path;  // for messages: "/dev/vfio/5 device 0000:00:04.0"
  uint64_t config_offset = 0;
  size_t bar0_size = 0;
  std::unique_ptr<VfioBar> bar;
  std::unique_ptr<VfioDma> dma;
};

namespace {

// The IOVA window: the largest range VFIO_IOMMU_GET_INFO reports (its IOVA-range capability),
// else [4 GiB, 512 GiB): above the x86 MSI window, inside a 39-bit address width.
std::pair<uint64_t, uint64_t> IovaWindow(int container) {
  std::pair<uint64_t, uint64_t> best = {4ull << 30, 512ull << 30};
  std::vector<uint8_t> buf(4096);
  auto* info = reinterpret_cast<vfio_iommu_type1_info*>(buf.data());
  info->argsz = buf.size();
  if (::ioctl(container, VFIO_IOMMU_GET_INFO, info) != 0) return best;
  if (!(info->flags & VFIO_IOMMU_INFO_CAPS) || info->cap_offset == 0) return best;
  uint64_t largest = 0;
  for (uint32_t off = info->cap_offset; off != 0 && off + sizeof(vfio_info_cap_header) <= buf.size();) {
    auto* cap = reinterpret_cast<vfio_info_cap_header*>(buf.data() + off);
    if (cap->id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE) {
      auto* ranges = reinterpret_cast<vfio_iommu_type1_info_cap_iova_range*>(cap);
      for (uint32_t i = 0; i < ranges->nr_iovas; ++i) {
        const auto& r = ranges->iova_ranges[i];
        const uint64_t start = r.start < (1ull << 20) ? (1ull << 20) : r.start;  // never IOVA 0
        if (r.end > start && r.end - start > largest) {
          largest = r.end - start;
          best = {start, r.end + 1};
        }
      }
    }
    off = cap->next;
  }
  return best;
}

absl::Status OpenContainer(VfioDevice::Parts& p) {
  const std::string path = p.options.dev_root + "/vfio/vfio";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "open", path, "modprobe vfio-pci");
  const int api = ::ioctl(fd.get(), VFIO_GET_API_VERSION);
  if (api != VFIO_API_VERSION) {
    return absl::FailedPreconditionError(absl::StrCat(
        "VFIO_GET_API_VERSION on ", path, ": ", api < 0 ? std::strerror(errno) : "",
        " got ", api, ", want ", VFIO_API_VERSION));
  }
  if (::ioctl(fd.get(), VFIO_CHECK_EXTENSION, VFIO_TYPE1_IOMMU) <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("VFIO_CHECK_EXTENSION(VFIO_TYPE1_IOMMU) on ", path, ": not supported"));
  }
  const std::string group_path = absl::StrCat(p.options.dev_root, "/vfio/", p.group);
  UniqueFd group(::open(group_path.c_str(), O_RDWR | O_CLOEXEC));
  if (!group.valid()) {
    const int err = errno;
    return ErrnoStatus(err, "open", group_path,
                       err == EBUSY
                           ? "the group is open in another process (or another VfioDevice)"
                           : absl::StrCat("tuttid needs root or the vfio group's owner", kDocs));
  }
  vfio_group_status status = {};
  status.argsz = sizeof(status);
  if (::ioctl(group.get(), VFIO_GROUP_GET_STATUS, &status) != 0) {
    return ErrnoStatus(errno, "VFIO_GROUP_GET_STATUS on", group_path);
  }
  if (!(status.flags & VFIO_GROUP_FLAGS_VIABLE)) {
    return absl::FailedPreconditionError(absl::StrCat(
        group_path, ": the group is not viable: bind every device in it to vfio-pci", kDocs));
  }
  int container_fd = fd.get();
  if (::ioctl(group.get(), VFIO_GROUP_SET_CONTAINER, &container_fd) != 0) {
    return ErrnoStatus(errno, "VFIO_GROUP_SET_CONTAINER on", group_path);
  }
  if (::ioctl(fd.get(), VFIO_SET_IOMMU, VFIO_TYPE1_IOMMU) != 0) {
    const int err = errno;
    ::ioctl(group.get(), VFIO_GROUP_UNSET_CONTAINER);
    return ErrnoStatus(err, "VFIO_SET_IOMMU(VFIO_TYPE1_IOMMU) on", path);
  }
  const auto [begin, end] = IovaWindow(fd.get());
  p.container = std::make_shared<Container>(begin, end);
  p.container->container = std::move(fd);
  p.container->group = std::move(group);
  p.container->group_path = group_path;
  return absl::OkStatus();
}

absl::Status OpenDevice(VfioDevice::Parts& p) {
  const std::string& group_path = p.container->group_path;
  p.device_path = absl::StrCat(group_path, " device ", p.options.pci_address);
  const int fd = ::ioctl(p.container->group.get(), VFIO_GROUP_GET_DEVICE_FD,
                         p.options.pci_address.c_str());
  if (fd < 0) return ErrnoStatus(errno, "VFIO_GROUP_GET_DEVICE_FD on", p.device_path);
  p.device.reset(fd);
  vfio_region_info config = {};
  config.argsz = sizeof(config);
  config.index = VFIO_PCI_CONFIG_REGION_INDEX;
  if (::ioctl(fd, VFIO_DEVICE_GET_REGION_INFO, &config) != 0) {
    return ErrnoStatus(errno, "VFIO_DEVICE_GET_REGION_INFO(config) on", p.device_path);
  }
  p.config_offset = config.offset;
  return absl::OkStatus();
}

// Sets (on) or clears (off) memory-space and bus-master in the PCI command register.
absl::Status SetBusMaster(VfioDevice::Parts& p, bool on) {
  uint16_t command = 0;
  const off_t at = static_cast<off_t>(p.config_offset + PCI_COMMAND);
  if (::pread(p.device.get(), &command, sizeof(command), at) != sizeof(command)) {
    return ErrnoStatus(errno, "pread of the PCI command register of", p.device_path);
  }
  const uint16_t bits = PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
  command = on ? (command | bits) : (command & ~PCI_COMMAND_MASTER);
  if (::pwrite(p.device.get(), &command, sizeof(command), at) != sizeof(command)) {
    return ErrnoStatus(errno, "pwrite of the PCI command register of", p.device_path);
  }
  return absl::OkStatus();
}

// How much of BAR0 may be mmapped from offset 0: the region, or its first sparse-mmap area.
size_t MappableFromZero(const std::vector<uint8_t>& buf) {
  const auto* info = reinterpret_cast<const vfio_region_info*>(buf.data());
  if (!(info->flags & VFIO_REGION_INFO_FLAG_CAPS) || info->cap_offset == 0) return info->size;
  for (uint32_t off = info->cap_offset; off != 0 && off + sizeof(vfio_info_cap_header) <= buf.size();) {
    const auto* cap = reinterpret_cast<const vfio_info_cap_header*>(buf.data() + off);
    if (cap->id == VFIO_REGION_INFO_CAP_SPARSE_MMAP) {
      const auto* sparse = reinterpret_cast<const vfio_region_info_cap_sparse_mmap*>(cap);
      for (uint32_t i = 0; i < sparse->nr_areas; ++i) {
        if (sparse->areas[i].offset == 0) return sparse->areas[i].size;
      }
      return 0;
    }
    off = cap->next;
  }
  return info->size;
}

absl::Status MapBar0(VfioDevice::Parts& p) {
  std::vector<uint8_t> buf(4096);
  auto* info = reinterpret_cast<vfio_region_info*>(buf.data());
  info->argsz = buf.size();
  info->index = VFIO_PCI_BAR0_REGION_INDEX;
  if (::ioctl(p.device.get(), VFIO_DEVICE_GET_REGION_INFO, info) != 0) {
    return ErrnoStatus(errno, "VFIO_DEVICE_GET_REGION_INFO(BAR0) on", p.device_path);
  }
  p.bar0_size = info->size;
  const size_t length = MappableFromZero(buf);
  if (!(info->flags & VFIO_REGION_INFO_FLAG_MMAP) || length < 0x1008) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BAR0 of ", p.device_path, " (", info->size, " bytes) cannot be mmapped from offset 0 (",
        length, " bytes may): no doorbells to ring"));
  }
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, p.device.get(),
                      static_cast<off_t>(info->offset));
  if (base == MAP_FAILED) return ErrnoStatus(errno, "mmap of BAR0 of", p.device_path);
  p.bar = std::make_unique<VfioBar>(static_cast<volatile uint8_t*>(base), length);
  return absl::OkStatus();
}

}  // namespace

absl::Status ProbeVfio(const VfioOptions& options) { return CheckAll(options).status(); }

absl::StatusOr<std::unique_ptr<VfioDevice>> VfioDevice::Open(const VfioOptions& options) {
  auto p = std::make_unique<Parts>();
  p->options = options;
  ASSIGN_OR_RETURN(p->group, CheckAll(options));
  RETURN_IF_ERROR(OpenContainer(*p));
  RETURN_IF_ERROR(OpenDevice(*p));
  RETURN_IF_ERROR(SetBusMaster(*p, true));
  RETURN_IF_ERROR(MapBar0(*p));
  p->dma = std::make_unique<VfioDma>(p->container, options.hugepages);
  return std::unique_ptr<VfioDevice>(new VfioDevice(std::move(p)));
}

VfioDevice::VfioDevice(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}

VfioDevice::~VfioDevice() {
  parts_->bar.reset();
  (void)SetBusMaster(*parts_, false);  // best effort: the kernel resets the device on release too
  parts_->device.reset();
}

RegisterSpace& VfioDevice::registers() { return *parts_->bar; }
DmaAllocator& VfioDevice::dma() { return *parts_->dma; }
const std::string& VfioDevice::pci_address() const { return parts_->options.pci_address; }
int VfioDevice::iommu_group() const { return parts_->group; }
size_t VfioDevice::bar0_region_size() const { return parts_->bar0_size; }

size_t VfioDevice::dma_mapped_bytes() const {
  absl::MutexLock lock(&parts_->container->mu);
  return parts_->container->mapped;
}

}  // namespace tutti::io::nvme
