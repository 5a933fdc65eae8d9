// A POSIX shared-memory object created by a host-mode engine for its KV cache, mapped read-write.
//
// The name is unique ("/<prefix>-<pid>-<random hex>"); the object is created with O_EXCL and mode
// 0600: tuttid never opens it by name: the engine hands it the descriptor (fd()). The destructor unmaps it and removes the name. Call
// Unlink() as soon as the daemon has mapped the region (after Attach) so that not even a SIGKILL of
// this process can leave the name behind; the mapping stays valid. For the window before that,
// UnlinkOnFatalSignals() installs handlers (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that remove the
// names of all live regions and then let the signal take its default action.
//
// Thread-safety: name(), data() and size() may be read from any thread; Unlink and the destructor
// must not race with each other.
#ifndef TUTTI_COMMON_SHM_REGION_H_
#define TUTTI_COMMON_SHM_REGION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tutti {

class ShmRegion {
 public:
  // Creates, sizes (zero-filled) and maps a new object. `prefix` must be non-empty, at most 64
  // characters of [A-Za-z0-9_.-]. Errors: INVALID_ARGUMENT for a bad prefix or a zero size,
  // RESOURCE_EXHAUSTED when /dev/shm has no room for `size` bytes, INTERNAL for other
  // system-call failures (the message names the call and errno). Nothing is left behind on error.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Create(std::string_view prefix, uint64_t size);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  // Removes the name; the mapping stays until destruction. Idempotent.
  void Unlink();
  bool linked() const { return linked_; }

  // The shm_open name, with its leading '/'. Still returned after Unlink.
  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  // The object's descriptor (read-write), what the engine hands tuttid (common/handoff.h).
  // Owned by the region; valid after Unlink too.
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

  // Installs the handlers described above, once per process. Safe to call more than once.
  static void UnlinkOnFatalSignals();

 private:
  ShmRegion(std::string name, uint8_t* data, uint64_t size, int slot, int fd)
      : name_(std::move(name)), data_(data), size_(size), slot_(slot), fd_(fd) {}
  void ReleaseSlot();

  std::string name_;
  uint8_t* data_;
  uint64_t size_;
  int slot_;  // index in the signal handler's table of live names; -1 for none
  int fd_;
  bool linked_ = true;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_SHM_REGION_H_
