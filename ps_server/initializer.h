#ifndef PSCLUSTER_PS_SERVER_INITIALIZER_H_
#define PSCLUSTER_PS_SERVER_INITIALIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/model.pb.h"
#include "proto/tensor.pb.h"

namespace pscluster {

// Deterministic initial values for dense variables and embedding-table rows.
//
// A value depends only on (spec, variable name, element index) or (spec, table name, key,
// position in the row), never on how a variable is partitioned or which task computes it: any
// process that fills any range of a variable gets the same numbers a single process filling the
// whole variable would. Two processes of the same build agree bit for bit; the normal kinds go
// through the C library's log/cos/sqrt in double precision before rounding to float, so builds
// against different math libraries could, very rarely, differ in the last bit of a value.
//
// How values are drawn. Each draw is 128 bits of Philox4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", 2011), a counter-based generator:
//   key     = a 64-bit hash of (seed, the name's 64-bit FNV-1a fingerprint, dense or table)
//   counter = (element index or table key, position in the row (0 for dense), draw number, 0)
// Uniforms use 53 of the bits; normals use Box-Muller on two 53-bit uniforms (keeping the
// cosine branch). No std:: distribution is used, since their output differs across standard
// libraries. Changing any of this changes every model's initial values.
//
// Kinds (v1::InitializerSpec::Kind):
//   ZEROS             0
//   CONSTANT          `value`
//   UNIFORM           U[min, max)
//   NORMAL            mean + stddev * z, z ~ N(0, 1)
//   TRUNCATED_NORMAL  mean + stddev * z, where z is redrawn (draw number 1, 2, ...) while
//                     |z| >= 2, as TensorFlow's truncated_normal does
//   GLOROT_UNIFORM    U[-limit, limit), limit = sqrt(6 / (fan_in + fan_out)), with the fans
//                     Keras computes from the variable's full shape:
//                       rank 1 [d]:         fan_in = fan_out = d
//                       rank 2 [in, out]:   fan_in = in, fan_out = out
//                       rank k > 2:         r = product of the first k - 2 dims,
//                                           fan_in = r * dims[k-2], fan_out = r * dims[k-1]
//                     A table row of `dim` floats counts as a rank-1 variable [dim].
//                     A scalar has no fans and is refused.
//   HE_NORMAL         TRUNCATED_NORMAL with mean 0 and stddev sqrt(2 / fan_in) / 0.8796...
//                     (Keras's he_normal: the truncated unit normal's stddev given back), the
//                     fans as for GLOROT_UNIFORM
// The seed is any uint64 (0 included); the same seed and name always give the same values.
//
// Thread-safety: these functions are pure and touch only their arguments; call them from any
// thread.

// Returns OK if `spec` can initialize some variable: its kind is known, the fields that kind
// reads are finite, stddev >= 0, and max > min for UNIFORM. Otherwise INVALID_ARGUMENT naming
// the field and its value. (GLOROT_UNIFORM also needs a shape of rank >= 1, which only
// InitializeDense can check.)
absl::Status ValidateInitializer(const v1::InitializerSpec& spec);

// Fills out[0..n) with elements [first_element, first_element + n) of the variable `name` of
// shape `full_shape`, in row-major order. Returns INVALID_ARGUMENT, leaving `out` untouched, if
// the spec is invalid (see ValidateInitializer), GLOROT_UNIFORM is asked of a scalar, a
// dimension is negative, the element count overflows int64, n < 0, or the range is not within
// [0, number of elements).
// REQUIRES: out points at n writable floats (it may be null when n == 0). Not owned.
absl::Status InitializeDense(const v1::InitializerSpec& spec, absl::string_view name,
                             const v1::TensorShape& full_shape, int64_t first_element, float* out,
                             int64_t n);

// Fills out[0..dim) with the initial row of `key` in table `table`. Any int64 key is valid.
// Element j of the row depends on (spec, table, key, j) and, for GLOROT_UNIFORM only, on dim;
// so a row's values are the same whichever ps task creates it, and whenever.
// Returns INVALID_ARGUMENT, leaving `out` untouched, if the spec is invalid or dim is not in
// [0, 2^31).
// REQUIRES: out points at dim writable floats (it may be null when dim == 0). Not owned.
absl::Status InitializeRow(const v1::InitializerSpec& spec, absl::string_view table, int64_t key,
                           int64_t dim, float* out);

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_INITIALIZER_H_
