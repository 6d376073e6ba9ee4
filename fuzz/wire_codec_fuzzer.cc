// Fuzzes the fp16 / bf16 / fp32 wire codec (common/wire_codec.h) against a scalar reference.
//
// Input: byte 0 picks the dtype (% 5: DT_INVALID, DT_FLOAT32, DT_FLOAT16, DT_BFLOAT16, or the
// int32 in bytes 1-4 as an arbitrary enum value), byte 1 an element-count skew (% 3 - 1: the
// count DecodeFloats is told is off by -1, 0 or +1); the rest is the payload.
// Invariants:
//   - DecodeFloats accepts exactly the payloads of n whole elements of a float dtype, and
//     decodes each element bit for bit as the scalar reference does (widening is exact);
//     refused calls are INVALID_ARGUMENT and leave the output untouched.
//   - the payload read as float32 values encodes, as fp16 and bf16, to the reference's
//     round-to-nearest-even bits (NaN quieted with its top payload bits, overflow to inf).
//   - decoding then encoding a 16-bit payload gives it back (NaNs quieted).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/wire_codec.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "proto/tensor.pb.h"

namespace pscluster {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t Load16(const std::string& bytes, size_t i) {
  return static_cast<uint16_t>(static_cast<uint8_t>(bytes[2 * i]) |
                               (static_cast<uint8_t>(bytes[2 * i + 1]) << 8));
}

// IEEE binary16 -> binary32 bits, by cases.
uint32_t RefWidenHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return sign | 0x7F800000u | (mantissa << 13);  // inf, NaN
  const double magnitude = exponent == 0
                               ? std::ldexp(static_cast<double>(mantissa), -24)
                               : std::ldexp(static_cast<double>(mantissa + 1024), exponent - 25);
  return sign | Bits(static_cast<float>(magnitude));
}

// binary32 -> binary16 bits, round to nearest even, computed in double.
uint16_t RefNarrowHalf(float x) {
  const uint32_t w = Bits(x);
  const uint16_t sign = static_cast<uint16_t>((w >> 16) & 0x8000u);
  if (std::isnan(x)) return sign | 0x7E00u | ((w >> 13) & 0x3FFu);
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(x) || a >= 65520.0) return sign | 0x7C00u;  // 65520 rounds up to inf
  int e2;
  std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1): a's exponent is e2 - 1
  const int e = e2 - 1;
  if (a == 0 || e < -14) {
    // Subnormal steps of 2^-24; 1024 steps is the smallest normal, which the bits also say.
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
  }
  const double q = std::nearbyint(std::ldexp(a, 10 - e));  // in [1024, 2048]
  // A q of 2048 carries into the exponent, up to 0x7C00 (inf): the sum says it.
  return sign | static_cast<uint16_t>(((e + 15) << 10) + (static_cast<int>(q) - 1024));
}

uint16_t RefNarrowBFloat16(float x) {
  const uint32_t w = Bits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((w >> 16) | 0x0040u);
  const uint32_t upper = w >> 16, lower = w & 0xFFFFu;
  const bool round_up = lower > 0x8000u || (lower == 0x8000u && (upper & 1u) != 0);
  return static_cast<uint16_t>(upper + (round_up ? 1 : 0));
}

uint32_t RefWiden(v1::DataType dtype, const std::string& bytes, size_t i) {
  if (dtype == v1::DT_FLOAT16) return RefWidenHalf(Load16(bytes, i));
  if (dtype == v1::DT_BFLOAT16) return static_cast<uint32_t>(Load16(bytes, i)) << 16;
  uint32_t u;
  std::memcpy(&u, bytes.data() + 4 * i, 4);
  return u;
}

uint16_t RefNarrow(v1::DataType dtype, float x) {
  return dtype == v1::DT_FLOAT16 ? RefNarrowHalf(x) : RefNarrowBFloat16(x);
}

// Decoding `payload` as `dtype`, told `n` elements.
void CheckDecode(v1::DataType dtype, const std::string& payload, int64_t n) {
  absl::StatusOr<int> width = WireBytesPerElement(dtype);
  constexpr uint32_t kCanary = 0xDEADBEEFu;
  std::vector<float> out(static_cast<size_t>(n > 0 ? n : 0) + 1, FromBits(kCanary));
  const absl::Status s = DecodeFloats(payload, dtype, out.data(), n);
  const bool fits = width.ok() && n >= 0 && static_cast<int64_t>(payload.size()) == n * *width;
  FUZZ_CHECK(s.ok() == fits, "dtype ", dtype, ", ", payload.size(), " bytes, n ", n, ": ",
             s.ToString());
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, s.ToString());
    for (float f : out) FUZZ_CHECK(Bits(f) == kCanary, "a refused decode wrote its output");
    return;
  }
  FUZZ_CHECK(Bits(out[n]) == kCanary, "DecodeFloats wrote past element ", n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t want = RefWiden(dtype, payload, i);
    FUZZ_CHECK(Bits(out[i]) == want, "dtype ", dtype, " element ", i, ": decoded bits ",
               absl::Hex(Bits(out[i])), ", reference ", absl::Hex(want));
  }
  if (dtype != v1::DT_FLOAT16 && dtype != v1::DT_BFLOAT16) {
    return;
  }
  // Decode then encode: the same payload, NaNs quieted.
  std::string again;
  const absl::Status e = EncodeFloats(out.data(), n, dtype, &again);
  FUZZ_CHECK(e.ok() && again.size() == payload.size(), e.ToString());
  for (int64_t i = 0; i < n; ++i) {
    uint16_t want = Load16(payload, i);
    const bool nan = (want & 0x7FFFu) > (dtype == v1::DT_FLOAT16 ? 0x7C00u : 0x7F80u);
    if (nan) want |= dtype == v1::DT_FLOAT16 ? 0x0200u : 0x0040u;
    FUZZ_CHECK(Load16(again, i) == want, "round trip of element ", i, ": ",
               absl::Hex(Load16(payload, i)), " came back as ", absl::Hex(Load16(again, i)));
  }
}

// Encoding the payload's whole float32 values as the 16-bit dtypes.
void CheckEncode(const std::string& payload) {
  const size_t n = payload.size() / 4;
  std::vector<float> values(n);
  if (n > 0) std::memcpy(values.data(), payload.data(), 4 * n);
  for (v1::DataType dtype : {v1::DT_FLOAT16, v1::DT_BFLOAT16}) {
    std::string encoded = "prefix";
    const absl::Status s = EncodeFloats(values.data(), static_cast<int64_t>(n), dtype, &encoded);
    FUZZ_CHECK(s.ok() && encoded.size() == 6 + 2 * n, s.ToString());
    FUZZ_CHECK(encoded.compare(0, 6, "prefix") == 0, "EncodeFloats changed what *out held");
    const std::string body = encoded.substr(6);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = RefNarrow(dtype, values[i]);
      FUZZ_CHECK(Load16(body, i) == want, "dtype ", dtype, ": ", values[i], " (bits ",
                 absl::Hex(Bits(values[i])), ") encoded as ", absl::Hex(Load16(body, i)),
                 ", reference ", absl::Hex(want));
    }
  }
}

}  // namespace
}  // namespace pscluster

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pscluster;
  FuzzInput in(data, size);
  const int pick = in.Small(0, 4);
  const int skew = in.Small(0, 2) - 1;
  v1::DataType dtype = v1::DT_INVALID;
  switch (pick) {
    case 0:
      dtype = v1::DT_INVALID;
      break;
    case 1:
      dtype = v1::DT_FLOAT32;
      break;
    case 2:
      dtype = v1::DT_FLOAT16;
      break;
    case 3:
      dtype = v1::DT_BFLOAT16;
      break;
    default:
      dtype = static_cast<v1::DataType>(in.Int<int32_t>());
      break;
  }
  const std::string payload = in.Rest();
  const absl::StatusOr<int> width = WireBytesPerElement(dtype);
  FUZZ_CHECK(width.ok() == std::isfinite(WireRelativeError(dtype)), "dtype ", dtype);
  const int64_t n =
      static_cast<int64_t>(payload.size()) / (width.ok() ? *width : 2) + (width.ok() ? skew : 0);
  CheckDecode(dtype, payload, n);
  if (width.ok() && skew != 0) {
    // The same payload trimmed to whole elements must decode.
    const int64_t whole = static_cast<int64_t>(payload.size()) / *width;
    CheckDecode(dtype, payload.substr(0, whole * *width), whole);
  }
  CheckEncode(payload);
  return 0;
}
