// Early-return helpers for absl::Status and absl::StatusOr (Abseil 20220623 has none).
#ifndef TUTTI_COMMON_STATUS_MACROS_H_
#define TUTTI_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TUTTI_CONCAT_INNER_(a, b) a##b
#define TUTTI_CONCAT_(a, b) TUTTI_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the current function if it is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status tutti_status_ = (expr);         \
    if (!tutti_status_.ok()) return tutti_status_; \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else moves the value
// into `lhs`, which may be a declaration: ASSIGN_OR_RETURN(auto x, MakeX());
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  TUTTI_ASSIGN_OR_RETURN_IMPL_(TUTTI_CONCAT_(tutti_statusor_, __LINE__), lhs, rexpr)

#define TUTTI_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return statusor.status();            \
  lhs = std::move(statusor).value()

#endif  // TUTTI_COMMON_STATUS_MACROS_H_
