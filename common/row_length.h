#ifndef PSCLUSTER_COMMON_ROW_LENGTH_H_
#define PSCLUSTER_COMMON_ROW_LENGTH_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/base/attributes.h"

namespace pscluster {

// Calls fn(n) with n the row length `dim`: a std::integral_constant for the dims embedding rows
// commonly have (4, 8, 16, 32, 64), an int64_t otherwise. Embedding rows are short (8 floats are
// 32 bytes), so a loop or copy over one row costs little next to a memcpy call or a loop set up
// for an unknown length; with n a constant, the compiler makes it a few vector moves. Always
// inlined, so that it takes the instruction set of the function it is used in (the ps's
// AVX2/baseline clones, ps_server/optimizer.cc).
template <typename Fn>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void WithRowLength(int64_t dim, const Fn& fn) {
  switch (dim) {
    case 4:
      return fn(std::integral_constant<int64_t, 4>());
    case 8:
      return fn(std::integral_constant<int64_t, 8>());
    case 16:
      return fn(std::integral_constant<int64_t, 16>());
    case 32:
      return fn(std::integral_constant<int64_t, 32>());
    case 64:
      return fn(std::integral_constant<int64_t, 64>());
    default:
      return fn(dim);
  }
}

// Keys between a request and a part of it: part[i] = whole[pos[i]] for i < count.
inline void GatherKeys(const int64_t* whole, const int64_t* pos, int64_t count, int64_t* part) {
  for (int64_t i = 0; i < count; ++i) part[i] = whole[pos[i]];
}

// Rows between a request and a part of it: GatherRows sets part[i * dim, (i + 1) * dim) from
// whole[pos[i] * dim, ...), ScatterRows the other way, for i < count; copies of a size known at
// compile time for the common dims.
inline void GatherRows(const float* whole, const int64_t* pos, int64_t count, int64_t dim,
                       float* part) {
  WithRowLength(dim, [&](auto n) {
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(part + i * n, whole + pos[i] * n, static_cast<size_t>(n) * sizeof(float));
    }
  });
}
inline void ScatterRows(const float* part, const int64_t* pos, int64_t count, int64_t dim,
                        float* whole) {
  WithRowLength(dim, [&](auto n) {
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(whole + pos[i] * n, part + i * n, static_cast<size_t>(n) * sizeof(float));
    }
  });
}

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_ROW_LENGTH_H_
