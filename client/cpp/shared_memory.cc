// SharedMemory: the public face of ShmRegion (common/shm_region.h).
#include "client/cpp/status_convert.h"
#include "common/shm_region.h"
#include "tutti/client.h"

namespace tutti::client {

struct SharedMemory::Rep {
  std::unique_ptr<ShmRegion> region;
};

SharedMemory::SharedMemory(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
SharedMemory::~SharedMemory() = default;

Result<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& prefix,
                                                           uint64_t size) {
  ShmRegion::UnlinkOnFatalSignals();
  absl::StatusOr<std::unique_ptr<ShmRegion>> region =
      ShmRegion::Create(prefix, size);
  if (!region.ok()) return FromAbsl(region.status());
  auto rep = std::make_unique<Rep>();
  rep->region = std::move(*region);
  return std::unique_ptr<SharedMemory>(new SharedMemory(std::move(rep)));
}

const std::string& SharedMemory::name() const { return rep_->region->name(); }
uint8_t* SharedMemory::data() const { return rep_->region->data(); }
uint64_t SharedMemory::size() const { return rep_->region->size(); }

HostRegion RegionOf(const SharedMemory& shm) { return {shm.name(), shm.data(), shm.size()}; }

}  // namespace tutti::client
