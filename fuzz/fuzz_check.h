#ifndef PSCLUSTER_FUZZ_FUZZ_CHECK_H_
#define PSCLUSTER_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

// The invariant checks of the fuzz targets: when `condition` is false, prints it with the
// StrCat of the remaining arguments and aborts, which libFuzzer (and :corpus_test) report as a
// crash with the input that caused it.
#define FUZZ_CHECK(condition, ...)                                                               \
  do {                                                                                           \
    if (!(condition)) {                                                                          \
      const std::string fuzz_check_detail = absl::StrCat(__VA_ARGS__);                           \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #condition, \
                   fuzz_check_detail.c_str());                                                   \
      std::abort();                                                                              \
    }                                                                                            \
  } while (0)

#endif  // PSCLUSTER_FUZZ_FUZZ_CHECK_H_
