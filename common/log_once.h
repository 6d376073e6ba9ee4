// PS_LOG_FIRST_N(severity, n): glog's LOG, for the first n times a statement runs in the
// process. glog's own LOG_FIRST_N (0.6, Debian 12) reads its counter again after incrementing
// it, so two threads that reach it together can both see 2 and neither logs: a line that tests
// and operators look for ("forwarding updates ... while the pushes arrive") went missing under
// concurrent pushes. Here each call takes its own number from one atomic increment.
//
//   PS_LOG_FIRST_N(INFO, 1) << "tensor data plane: kernel TLS encrypts this ps's sends";

#ifndef PSCLUSTER_COMMON_LOG_ONCE_H_
#define PSCLUSTER_COMMON_LOG_ONCE_H_

#include <atomic>

#include "glog/logging.h"

#define PS_LOG_FIRST_N(severity, n)                                          \
  if (static std::atomic<int> ps_log_first_n_calls{0};                       \
      ps_log_first_n_calls.fetch_add(1, std::memory_order_relaxed) >= (n)) { \
  } else                                                                     \
    LOG(severity)

#endif  // PSCLUSTER_COMMON_LOG_ONCE_H_
