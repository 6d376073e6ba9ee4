#include "common/wire_codec.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "absl/base/casts.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/tensor.pb.h"

#ifdef __F16C__
#include <immintrin.h>
#endif

namespace pscluster {
namespace {

// The wire format is little-endian; float32 tensors are copied as they lie in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "wire_codec copies float32 tensors raw and needs a little-endian host");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559,
              "wire_codec needs IEEE 754 binary32 floats");

// Elements converted per block. Each block is converted in two fixed-count loops through
// local buffers that nothing else can alias: one computes on 32-bit lanes, one narrows (or
// widens) between 16 and 32 bits. That is what lets GCC vectorize at -O2 (its "very cheap"
// cost model neither versions loops for aliasing nor adds epilogues), and keeping the
// arithmetic and the 16-bit packing apart stops it from shuffling every intermediate down to
// 16-bit lanes, which with plain SSE2 costs twice the time.
constexpr int kBlock = 512;

// All ones where `condition` holds, else 0.
inline uint32_t MaskIf(bool condition) { return 0u - static_cast<uint32_t>(condition); }

// `if_set` where `mask` is all ones, `if_clear` where it is 0. Unlike ?:, this keeps GCC from
// sinking a floating-point operation into a branch it then cannot vectorize (with the default
// -ftrapping-math it will not execute an FP operation speculatively).
inline uint32_t Select(uint32_t mask, uint32_t if_set, uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

// A codec maps float32 bits to 16-bit patterns (in the low half of a uint32) and back. Every
// function is branch-free: each case is computed and the right one selected. Comparisons are
// on int32 where both sides are non-negative: SSE2 has only signed 32-bit compares.

// IEEE 754 binary16.
struct HalfCodec {
  static uint32_t Narrow(uint32_t w) {
    const uint32_t sign = (w >> 16) & 0x8000u;
    const uint32_t a = w & 0x7FFFFFFFu;
    // |x| >= 2^-14: rebias the exponent (127 -> 15, i.e. subtract 112 << 23) and round the 13
    // dropped mantissa bits to nearest even. A carry out of the mantissa bumps the exponent,
    // up to 0x7C00 (inf); anything larger, float inf included, clamps to inf. For smaller `a`
    // the subtraction wraps, but that lane is not selected.
    const int32_t rounded =
        static_cast<int32_t>((a - 0x38000000u + 0x0FFFu + ((a >> 13) & 1u)) >> 13);
    const uint32_t normal = static_cast<uint32_t>(rounded < 0x7C00 ? rounded : 0x7C00);
    // |x| < 2^-14: in 0.5f + |x| the last mantissa bit is worth 2^-24, the half subnormal step,
    // so the FPU's round-to-nearest-even addition leaves the half bits (up to 0x400, the
    // smallest normal, when rounding carries) at the bottom of the sum. Float subnormal
    // inputs are far below half precision, so flush-to-zero modes give the same 0.
    const uint32_t subnormal =
        absl::bit_cast<uint32_t>(absl::bit_cast<float>(a) + 0.5f) - 0x3F000000u;
    // NaN: quiet it and keep the top of the payload, as F16C's vcvtps2ph does.
    const uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
    const int32_t magnitude = static_cast<int32_t>(a);
    uint32_t bits = Select(MaskIf(magnitude < 0x38800000), subnormal, normal);
    bits = Select(MaskIf(magnitude > 0x7F800000), nan, bits);
    return sign | bits;
  }

  static uint32_t Widen(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exponent = h & 0x7C00u;
    const uint32_t shifted = (h & 0x7FFFu) << 13;
    // Exponent 1..30: rebias 15 -> 127. Exponent 31 (inf, NaN): 31 -> 255, payload kept.
    const uint32_t normal = shifted + 0x38000000u;
    const uint32_t inf_nan = shifted + 0x70000000u;
    // Exponent 0 (zero, subnormal): (0.5 + m * 2^-24) - 0.5 is exactly m * 2^-24.
    const uint32_t subnormal =
        absl::bit_cast<uint32_t>(absl::bit_cast<float>(0x3F000000u | (h & 0x3FFu)) - 0.5f);
    uint32_t bits = Select(MaskIf(exponent == 0), subnormal, normal);
    bits = Select(MaskIf(exponent == 0x7C00u), inf_nan, bits);
    return sign | bits;
  }
};

// bfloat16: the top 16 bits of a float32.
struct BFloat16Codec {
  static uint32_t Narrow(uint32_t w) {
    // Round to nearest even on the 16 dropped bits; a carry bumps the exponent, up to inf.
    // NaN is excluded first, so the sum cannot wrap past 0xFFFFFFFF.
    const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
    // Truncating a NaN could leave an all-zero mantissa (inf); set the quiet bit instead.
    const uint32_t nan = (w >> 16) | 0x0040u;
    return Select(MaskIf(static_cast<int32_t>(w & 0x7FFFFFFFu) > 0x7F800000), nan, rounded);
  }

  static uint32_t Widen(uint32_t h) { return h << 16; }
};

// Encodes values[0..kBlock) into out[0..2 kBlock).
template <typename Codec>
void NarrowBlock(const float* values, char* out) {
  uint32_t bits[kBlock];
  for (int j = 0; j < kBlock; ++j) bits[j] = Codec::Narrow(absl::bit_cast<uint32_t>(values[j]));
  for (int j = 0; j < kBlock; ++j) {
    const uint16_t narrow = static_cast<uint16_t>(bits[j]);
    std::memcpy(out + 2 * j, &narrow, sizeof(narrow));
  }
}

// Decodes in[0..2 kBlock) into out[0..kBlock).
template <typename Codec>
void WidenBlock(const char* in, float* out) {
  uint32_t bits[kBlock];
  for (int j = 0; j < kBlock; ++j) {
    uint16_t narrow;
    std::memcpy(&narrow, in + 2 * j, sizeof(narrow));
    bits[j] = narrow;
  }
  for (int j = 0; j < kBlock; ++j) out[j] = absl::bit_cast<float>(Codec::Widen(bits[j]));
}

// Encodes values[0..n) as 16-bit elements into out[0..2n). `out` needs no alignment.
template <typename Codec>
void NarrowTo16(const float* values, int64_t n, char* out) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) NarrowBlock<Codec>(values + i, out + 2 * i);
  const int64_t rest = n - i;
  if (rest == 0) return;
  // The last partial block goes through a zero-padded full one, so that every conversion
  // loop has the constant trip count that the vectorizer wants.
  float padded[kBlock] = {};
  char encoded[2 * kBlock];
  std::memcpy(padded, values + i, sizeof(float) * rest);
  NarrowBlock<Codec>(padded, encoded);
  std::memcpy(out + 2 * i, encoded, 2 * rest);
}

// Decodes n 16-bit elements from in[0..2n) into out[0..n). `in` needs no alignment.
template <typename Codec>
void WidenFrom16(const char* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) WidenBlock<Codec>(in + 2 * i, out + i);
  const int64_t rest = n - i;
  if (rest == 0) return;
  char padded[2 * kBlock] = {};
  float decoded[kBlock];
  std::memcpy(padded, in + 2 * i, 2 * rest);
  WidenBlock<Codec>(padded, decoded);
  std::memcpy(out + i, decoded, sizeof(float) * rest);
}

#ifdef __F16C__
// The hardware converters, 8 elements at a time; the last n % 8 go the portable way, which
// gives the same bits.
void NarrowToHalf(const float* values, int64_t n, char* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(values + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  NarrowTo16<HalfCodec>(values + i, n - i, out + 2 * i);
}

void WidenFromHalf(const char* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  WidenFrom16<HalfCodec>(in + 2 * i, n - i, out + i);
}
#else
void NarrowToHalf(const float* values, int64_t n, char* out) {
  NarrowTo16<HalfCodec>(values, n, out);
}

void WidenFromHalf(const char* in, int64_t n, float* out) { WidenFrom16<HalfCodec>(in, n, out); }
#endif

// "DT_FLOAT16 (2)", or "99" for a value the enum does not name.
std::string DtypeName(v1::DataType dtype) {
  const std::string& name = v1::DataType_Name(dtype);
  if (name.empty()) return absl::StrCat(static_cast<int>(dtype));
  return absl::StrCat(name, " (", static_cast<int>(dtype), ")");
}

absl::Status UnsupportedDtype(v1::DataType dtype) {
  return absl::InvalidArgumentError(
      absl::StrCat("wire dtype ", DtypeName(dtype),
                   " is not a float encoding; expected DT_FLOAT32, DT_FLOAT16 or DT_BFLOAT16"));
}

// Like WireBytesPerElement, 0 for an unsupported dtype.
int BytesPerElementOrZero(v1::DataType dtype) {
  switch (dtype) {
    case v1::DT_INVALID:
    case v1::DT_FLOAT32:
      return 4;
    case v1::DT_FLOAT16:
    case v1::DT_BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

// n elements of `bytes_per_element` bytes must fit an int64 byte count.
absl::Status CheckCount(int64_t n, int bytes_per_element) {
  if (n < 0 || n > std::numeric_limits<int64_t>::max() / bytes_per_element) {
    return absl::InvalidArgumentError(
        absl::StrCat("element count ", n, " is out of range [0, ",
                     std::numeric_limits<int64_t>::max() / bytes_per_element, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> WireBytesPerElement(v1::DataType dtype) {
  const int bytes = BytesPerElementOrZero(dtype);
  if (bytes == 0) return UnsupportedDtype(dtype);
  return bytes;
}

absl::Status EncodeFloats(const float* values, int64_t n, v1::DataType dtype, std::string* out) {
  const int bytes_per_element = BytesPerElementOrZero(dtype);
  if (bytes_per_element == 0) return UnsupportedDtype(dtype);
  absl::Status count_ok = CheckCount(n, bytes_per_element);
  if (!count_ok.ok()) return count_ok;
  const int64_t bytes = n * bytes_per_element;
  if (bytes > static_cast<int64_t>(out->max_size() - out->size())) {
    return absl::InvalidArgumentError(absl::StrCat("encoding ", n, " elements needs ", bytes,
                                                   " bytes, more than a string can hold"));
  }
  if (n == 0) return absl::OkStatus();
  const size_t old_size = out->size();
  out->resize(old_size + static_cast<size_t>(bytes));
  EncodeFloatsTo(values, n, dtype, &(*out)[old_size]);
  return absl::OkStatus();
}

void EncodeFloatsTo(const float* values, int64_t n, v1::DataType dtype, char* out) {
  if (n <= 0) return;
  switch (dtype) {
    case v1::DT_INVALID:
    case v1::DT_FLOAT32:
      std::memcpy(out, values, sizeof(float) * static_cast<size_t>(n));
      return;
    case v1::DT_FLOAT16:
      NarrowToHalf(values, n, out);
      return;
    case v1::DT_BFLOAT16:
      NarrowTo16<BFloat16Codec>(values, n, out);
      return;
    default:
      // A caller that skipped WireBytesPerElement has no buffer of a meaningful size.
      std::fprintf(stderr, "EncodeFloatsTo: %s\n", UnsupportedDtype(dtype).ToString().c_str());
      std::abort();
  }
}

absl::Status DecodeFloats(absl::string_view bytes, v1::DataType dtype, float* out, int64_t n) {
  const int bytes_per_element = BytesPerElementOrZero(dtype);
  if (bytes_per_element == 0) return UnsupportedDtype(dtype);
  absl::Status count_ok = CheckCount(n, bytes_per_element);
  if (!count_ok.ok()) return count_ok;
  const int64_t expected = n * bytes_per_element;
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wire payload size mismatch: expected ", expected, " bytes (", n, " elements of ",
        DtypeName(dtype), " at ", bytes_per_element, " bytes each), got ", bytes.size()));
  }
  if (n == 0) return absl::OkStatus();
  switch (dtype) {
    case v1::DT_FLOAT16:
      WidenFromHalf(bytes.data(), n, out);
      break;
    case v1::DT_BFLOAT16:
      WidenFrom16<BFloat16Codec>(bytes.data(), n, out);
      break;
    default:  // DT_FLOAT32, DT_INVALID.
      std::memcpy(out, bytes.data(), bytes.size());
      break;
  }
  return absl::OkStatus();
}

double WireRelativeError(v1::DataType dtype) {
  switch (dtype) {
    case v1::DT_INVALID:
    case v1::DT_FLOAT32:
      return 0.0;
    case v1::DT_FLOAT16:
      return 0x1p-11;  // half an ulp of an 11-bit significand
    case v1::DT_BFLOAT16:
      return 0x1p-8;  // half an ulp of an 8-bit significand
    default:
      return std::numeric_limits<double>::infinity();
  }
}

}  // namespace pscluster
