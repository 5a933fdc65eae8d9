#include "daemon/io/io_backend.h"

#include <memory>

#include "absl/synchronization/notification.h"

namespace tutti::io {

void IoBackend::Execute(absl::Span<IoRequest> batch) {
  // Shared so that `done` may still be inside Notify() when this frame returns.
  auto finished = std::make_shared<absl::Notification>();
  Submit(batch, [finished] { finished->Notify(); });
  finished->WaitForNotification();
}

}  // namespace tutti::io
