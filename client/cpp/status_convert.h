// Internal: conversions between the public tutti::client::Status and absl::Status (the codes are
// numerically equal, as are gRPC's).
#ifndef TUTTI_CLIENT_CPP_STATUS_CONVERT_H_
#define TUTTI_CLIENT_CPP_STATUS_CONVERT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tutti/client.h"

namespace tutti::client {

Status FromAbsl(const absl::Status& status);
absl::Status ToAbsl(const Status& status);

// absl::StatusOr<T> -> Result<T>.
template <typename T>
Result<T> FromAbslOr(absl::StatusOr<T> value) {
  if (!value.ok()) return FromAbsl(value.status());
  return Result<T>(std::move(value).value());
}

}  // namespace tutti::client

#endif  // TUTTI_CLIENT_CPP_STATUS_CONVERT_H_
