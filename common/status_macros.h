#ifndef PSCLUSTER_COMMON_STATUS_MACROS_H_
#define PSCLUSTER_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Abseil 20220623 has neither RETURN_IF_ERROR nor ASSIGN_OR_RETURN; these are the project's
// only definitions of the two.

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not OK.
#define PS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status ps_status_ = (expr);      \
    if (!ps_status_.ok()) return ps_status_; \
  } while (0)

#define PS_STATUS_MACROS_CONCAT_INNER_(x, y) x##y
#define PS_STATUS_MACROS_CONCAT_(x, y) PS_STATUS_MACROS_CONCAT_INNER_(x, y)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, otherwise moves the
// value into `lhs`, which may be a declaration: PS_ASSIGN_OR_RETURN(auto x, MakeX());
#define PS_ASSIGN_OR_RETURN(lhs, rexpr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_STATUS_MACROS_CONCAT_(ps_statusor_, __LINE__), lhs, rexpr)

#define PS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()

#endif  // PSCLUSTER_COMMON_STATUS_MACROS_H_
