// An owned file descriptor, closed on destruction. Movable, not copyable.
//
// Thread-safety: none (like the int it wraps).
#ifndef TUTTI_COMMON_UNIQUE_FD_H_
#define TUTTI_COMMON_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace tutti {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller closes the returned descriptor.
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_UNIQUE_FD_H_
