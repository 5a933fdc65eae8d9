#include "common/shm_region.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tutti {
namespace {

// Names of live regions, as /dev/shm paths, for the signal handler (which may only call
// async-signal-safe functions: unlink is one). state: 0 free, 1 being written, 2 live.
constexpr int kLiveSlots = 32;
struct LiveName {
  std::atomic<int> state{0};
  char path[300];
};
LiveName g_live[kLiveSlots];

int ClaimSlot(const std::string& name) {
  for (int i = 0; i < kLiveSlots; ++i) {
    int expected = 0;
    if (!g_live[i].state.compare_exchange_strong(expected, 1)) continue;
    absl::SNPrintF(g_live[i].path, sizeof(g_live[i].path), "/dev/shm%s", name);
    g_live[i].state.store(2);
    return i;
  }
  return -1;  // table full: this region is only cleaned up by its destructor
}

void OnFatalSignal(int sig) {
  for (auto& live : g_live) {
    if (live.state.load() == 2) unlink(live.path);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

bool ValidPrefix(std::string_view prefix) {
  if (prefix.empty() || prefix.size() > 64) return false;
  for (char c : prefix) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status ErrnoStatus(const char* call, const std::string& name, int err) {
  std::string msg = absl::StrFormat("%s(%s): %s", call, name, strerror(err));
  if (err == ENOSPC || err == ENOMEM) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(std::string_view prefix,
                                                             uint64_t size) {
  if (!ValidPrefix(prefix)) {
    return absl::InvalidArgumentError(absl::StrCat("shm prefix '", std::string(prefix),
                                                   "' must be 1..64 characters of [A-Za-z0-9_.-]"));
  }
  if (size == 0) return absl::InvalidArgumentError("shm size must be > 0");
  std::random_device rd;
  const std::string name = absl::StrFormat("/%s-%d-%08x%08x", prefix, getpid(), rd(), rd());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return ErrnoStatus("shm_open", name, errno);
  // posix_fallocate reserves the pages now, so a full /dev/shm is an error here rather than a
  // SIGBUS on first touch.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return ErrnoStatus("posix_fallocate", name, err);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = errno;
  if (p == MAP_FAILED) {
    close(fd);
    shm_unlink(name.c_str());
    return ErrnoStatus("mmap", name, err);
  }
  const int slot = ClaimSlot(name);
  return std::unique_ptr<ShmRegion>(
      new ShmRegion(name, static_cast<uint8_t*>(p), size, slot, fd));
}

ShmRegion::~ShmRegion() {
  Unlink();
  munmap(data_, size_);
  close(fd_);
}

void ShmRegion::ReleaseSlot() {
  if (slot_ < 0) return;
  g_live[slot_].state.store(0);
  slot_ = -1;
}

void ShmRegion::Unlink() {
  if (!linked_) return;
  ReleaseSlot();
  shm_unlink(name_.c_str());
  linked_ = false;
}

void ShmRegion::UnlinkOnFatalSignals() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = OnFatalSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace tutti
