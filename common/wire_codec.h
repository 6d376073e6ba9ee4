#ifndef PSCLUSTER_COMMON_WIRE_CODEC_H_
#define PSCLUSTER_COMMON_WIRE_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/tensor.pb.h"

namespace pscluster {

// Conversion between float32 tensors in memory and their wire encodings (v1::DataType):
// DT_FLOAT32 (4 bytes an element), DT_FLOAT16 (IEEE 754 binary16, 2 bytes) and DT_BFLOAT16
// (the top half of a float32, 2 bytes), all little-endian, packed with no padding.
// DT_INVALID, the proto default, means DT_FLOAT32. Any other dtype (DT_INT64, unknown values)
// is not a float wire encoding and is rejected with INVALID_ARGUMENT naming it.
//
// Narrowing rounds to nearest, ties to even; values beyond the 16-bit range become +-inf;
// fp16 subnormals are produced and read exactly; NaN stays NaN (quieted, with the top payload
// bits kept, as x86 F16C does). Widening is exact. The conversions are written as
// branch-free loops that the compiler vectorizes; where the build has F16C (-mf16c) fp16 uses
// the hardware instructions, with bit-identical results.
//
// All functions are pure and thread-safe: concurrent calls may run on distinct output buffers.
// The portable fp16 path assumes the default floating-point rounding mode (round to nearest);
// flush-to-zero / denormals-are-zero modes do not change its results.

// The dtype a request's values travel in: DT_INVALID (the field unset) means DT_FLOAT32.
inline v1::DataType WireOrFloat(v1::DataType t) { return t == v1::DT_INVALID ? v1::DT_FLOAT32 : t; }

// Bytes per element of a wire dtype: 4 for DT_FLOAT32 (and DT_INVALID), 2 for DT_FLOAT16 and
// DT_BFLOAT16. INVALID_ARGUMENT naming the dtype for anything else.
absl::StatusOr<int> WireBytesPerElement(v1::DataType dtype);

// Appends `n` floats from `values` to *out, encoded as `dtype`: n * WireBytesPerElement(dtype)
// bytes. On error *out is unchanged: INVALID_ARGUMENT for an unsupported dtype or a negative
// or oversized `n`.
// REQUIRES: out != nullptr; values points to n floats (may be null when n == 0).
absl::Status EncodeFloats(const float* values, int64_t n, v1::DataType dtype, std::string* out);

// Like EncodeFloats, into a caller buffer of exactly n * WireBytesPerElement(dtype) bytes
// (no alignment needed). `values` and `out` must not overlap.
// REQUIRES: WireBytesPerElement(dtype).ok() (an unsupported dtype aborts the process);
// n >= 0.
void EncodeFloatsTo(const float* values, int64_t n, v1::DataType dtype, char* out);

// Decodes `bytes`, n elements encoded as `dtype`, into out[0..n). INVALID_ARGUMENT for an
// unsupported dtype, a negative `n`, or when bytes.size() != n * WireBytesPerElement(dtype)
// (the message gives the expected and the actual size); out is untouched on error.
// REQUIRES: out points to n floats (may be null when n == 0) and does not overlap `bytes`.
absl::Status DecodeFloats(absl::string_view bytes, v1::DataType dtype, float* out, int64_t n);

// The largest relative error |decoded - x| / |x| of an encode/decode round trip of a value x
// in the normal range of `dtype`: 2^-11 for DT_FLOAT16, 2^-8 for DT_BFLOAT16, 0 for
// DT_FLOAT32 and DT_INVALID. +infinity for a dtype that WireBytesPerElement rejects.
double WireRelativeError(v1::DataType dtype);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_WIRE_CODEC_H_
