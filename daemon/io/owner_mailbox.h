// How other threads hand work to a queue's one owner thread (uring_owner.h, for both io_uring
// backends: one ring and one owner per pool file or namespace): items to issue, control tasks to
// run on the owner (buffer registration, which io_uring requires from the ring's submitter), and
// the stop request. Each of them, once queued, calls the mailbox's `wake` (the owner may be
// waiting elsewhere than on the mailbox: in the kernel, for a completion).
//
// Thread-safety: Post, RunOnOwner and Stop from any thread; Take from the owner only.
#ifndef TUTTI_DAEMON_IO_OWNER_MAILBOX_H_
#define TUTTI_DAEMON_IO_OWNER_MAILBOX_H_

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace tutti::io {

template <typename Item>
class OwnerMailbox {
 public:
  // `wake` runs on the posting thread after each Post, PostOne, RunOnOwner and Stop has queued
  // its part (outside the mailbox's lock); it may be empty.
  explicit OwnerMailbox(std::function<void()> wake = nullptr) : wake_(std::move(wake)) {}

  // Appends `items` (in order) for the owner's next Take.
  void Post(std::vector<Item> items) {
    {
      absl::MutexLock lock(&mu_);
      if (incoming_.empty()) {
        incoming_ = std::move(items);
      } else {
        incoming_.insert(incoming_.end(), items.begin(), items.end());
      }
    }
    Wake();
  }
  void PostOne(Item item) {
    {
      absl::MutexLock lock(&mu_);
      incoming_.push_back(std::move(item));
    }
    Wake();
  }

  // Runs `task` on the owner thread (at its next Take) and returns its status. Must not be called
  // from the owner thread (it would wait for itself).
  absl::Status RunOnOwner(std::function<absl::Status()> task) {
    auto finished = std::make_shared<absl::Notification>();
    auto status = std::make_shared<absl::Status>();
    {
      absl::MutexLock lock(&mu_);
      control_.push_back([task = std::move(task), finished, status] {
        *status = task();
        finished->Notify();
      });
    }
    Wake();
    finished->WaitForNotification();
    return *status;
  }

  // From now on Take reports stopping (and no longer blocks).
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    Wake();
  }

  struct Taken {
    std::vector<Item> items;  // posted since the last Take, in order
    bool ran_control = false;  // whether control tasks ran in this Take
    bool stopping = false;
  };

  // Whether items or control tasks wait for a Take (the stop request not counted: an owner that
  // is stopping still waits for what it has in flight).
  bool HasPosts() {
    absl::MutexLock lock(&mu_);
    return !incoming_.empty() || !control_.empty();
  }

  // Owner only: with `block`, waits until something is posted or Stop was called. Runs the
  // pending control tasks (before returning the items) and returns what was posted.
  Taken Take(bool block) {
    Taken t;
    std::vector<std::function<void()>> control;
    {
      absl::MutexLock lock(&mu_);
      if (block) {
        mu_.Await(absl::Condition(
            +[](OwnerMailbox* m) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return !m->incoming_.empty() || !m->control_.empty() || m->stopping_;
            },
            this));
      }
      t.items.swap(incoming_);
      control.swap(control_);
      t.stopping = stopping_;
    }
    for (auto& task : control) task();
    t.ran_control = !control.empty();
    return t;
  }

 private:
  void Wake() {
    if (wake_) wake_();
  }

  const std::function<void()> wake_;
  absl::Mutex mu_;
  std::vector<Item> incoming_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> control_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_OWNER_MAILBOX_H_
