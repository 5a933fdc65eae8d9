#include "daemon/io/nvme_open.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/io/nvme/controller.h"
#include "daemon/io/nvme/vfio.h"
#include "daemon/io/nvme_backend.h"

namespace tutti::io {
namespace {

// One SSD: its device and the controller driving it (declared in destruction order's reverse).
struct Ssd {
  std::string address;
  OpenedNvmeDevice device;
  std::unique_ptr<nvme::Controller> controller;
};

// Shuts the controllers down, then closes the devices, in reverse order of opening.
void CloseSsds(std::vector<Ssd>* ssds) {
  while (!ssds->empty()) {
    Ssd& ssd = ssds->back();
    if (ssd.controller) {
      absl::Status s = ssd.controller->Shutdown();
      if (s.ok()) {
        log::Get("nvme")->info("nvme {}: controller shut down", ssd.address);
      } else {
        log::Get("nvme")->warn("nvme {}: shutdown: {}", ssd.address, s.ToString());
      }
      ssd.controller.reset();
    }
    ssds->pop_back();  // the device goes after its controller
  }
}

// The NvmeBackend and everything it runs on. Members go in reverse order: the backend (its workers
// stopped) first, then the controllers (shut down), then the devices.
class OwningNvmeBackend final : public IoBackend {
 public:
  OwningNvmeBackend(std::vector<Ssd> ssds, std::unique_ptr<NvmeBackend> backend)
      : ssds_(std::move(ssds)), backend_(std::move(backend)) {}
  ~OwningNvmeBackend() override {
    backend_.reset();
    CloseSsds(&ssds_);
  }

  std::string_view name() const override { return backend_->name(); }
  uint32_t num_files() const override { return backend_->num_files(); }
  uint64_t file_size(uint32_t file) const override { return backend_->file_size(file); }
  bool ReadsInto(MemoryKind kind) const override { return backend_->ReadsInto(kind); }
  absl::Status RegisterBuffer(absl::Span<uint8_t> region) override {
    return backend_->RegisterBuffer(region);
  }
  void Submit(absl::Span<IoRequest> batch, std::function<void()> done) override {
    backend_->Submit(batch, std::move(done));
  }
  absl::Status Sync(uint32_t file) override { return backend_->Sync(file); }

 private:
  std::vector<Ssd> ssds_;
  std::unique_ptr<NvmeBackend> backend_;
};

absl::Status Prefixed(const std::string& address, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("nvme ", address, ": ", s.message()));
}

}  // namespace

NvmeDeviceOpener VfioOpener(const NvmeOpenOptions& options) {
  return [options](const std::string& address) -> absl::StatusOr<OpenedNvmeDevice> {
    nvme::VfioOptions vo;
    vo.pci_address = address;
    vo.sysfs_root = options.sysfs_root;
    vo.dev_root = options.dev_root;
    absl::Status probe = nvme::ProbeVfio(vo);
    if (!probe.ok()) {
      return absl::UnavailableError(
          absl::StrCat("io.nvme_devices: ", address, ": ", probe.message()));
    }
    auto device = nvme::VfioDevice::Open(vo);
    if (absl::IsUnavailable(device.status())) {  // busy: not a reason to run elsewhere
      return absl::FailedPreconditionError(device.status().message());
    }
    if (!device.ok()) return device.status();
    OpenedNvmeDevice opened;
    opened.regs = &(*device)->registers();
    opened.dma = &(*device)->dma();
    opened.owner = std::shared_ptr<nvme::VfioDevice>(*std::move(device));
    return opened;
  };
}

absl::StatusOr<std::unique_ptr<IoBackend>> OpenNvmeBackend(const NvmeOpenOptions& options,
                                                           NvmeDeviceOpener opener) {
  if (options.pci_addresses.empty()) {
    return absl::InvalidArgumentError("io.nvme_devices: the \"nvme\" backend needs at least one");
  }
  if (!opener) opener = VfioOpener(options);
  std::vector<Ssd> ssds;
  std::vector<NvmeBackendDevice> devices;
  for (const std::string& address : options.pci_addresses) {
    auto device = opener(address);
    if (!device.ok()) {
      CloseSsds(&ssds);
      return device.status();
    }
    ssds.push_back(Ssd{address, *std::move(device), nullptr});
    nvme::ControllerOptions co;
    co.name = absl::StrCat("nvme ", address);
    co.nsid = options.nsid;
    co.io_queue_depth = options.queue_depth;
    auto controller = nvme::Controller::Create(co, ssds.back().device.regs, ssds.back().device.dma);
    if (!controller.ok()) {
      CloseSsds(&ssds);
      return Prefixed(address, controller.status());
    }
    ssds.back().controller = *std::move(controller);
    const nvme::ControllerInfo& info = ssds.back().controller->info();
    log::Get("nvme")->info(
        "nvme {}: {} (serial {}, firmware {}), namespace {}: {} blocks of {} bytes", address,
        info.model, info.serial, info.firmware, options.nsid, ssds.back().controller->ns().blocks,
        ssds.back().controller->ns().lba_size());
    devices.push_back({ssds.back().controller.get(), ssds.back().device.dma});
  }
  auto backend = NvmeBackend::Create(NvmeBackendOptions{}, devices);
  if (!backend.ok()) {
    CloseSsds(&ssds);
    return backend.status();
  }
  return std::unique_ptr<IoBackend>(
      std::make_unique<OwningNvmeBackend>(std::move(ssds), *std::move(backend)));
}

}  // namespace tutti::io
