#include "common/wire_codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/base/casts.h"
#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/tensor.pb.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

float FromBits(uint32_t bits) { return absl::bit_cast<float>(bits); }
uint32_t ToBits(float f) { return absl::bit_cast<uint32_t>(f); }

// Encodes `values` and returns the 16-bit elements.
std::vector<uint16_t> EncodeAll16(const std::vector<float>& values, v1::DataType dtype) {
  std::string bytes;
  const absl::Status s = EncodeFloats(values.data(), values.size(), dtype, &bytes);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(bytes.size(), 2 * values.size());
  std::vector<uint16_t> out(values.size());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

uint16_t Encode16(float value, v1::DataType dtype) { return EncodeAll16({value}, dtype)[0]; }

std::vector<float> DecodeAll16(const std::vector<uint16_t>& bits, v1::DataType dtype) {
  std::vector<float> out(bits.size());
  const absl::string_view bytes(reinterpret_cast<const char*>(bits.data()), 2 * bits.size());
  const absl::Status s = DecodeFloats(bytes, dtype, out.data(), out.size());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

float Decode16(uint16_t bits, v1::DataType dtype) {
  return DecodeAll16(std::vector<uint16_t>{bits}, dtype)[0];
}

bool IsHalfNan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0; }
bool IsBFloat16Nan(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0; }

// Slow reference encoders, written from the definitions with double arithmetic: the value is
// scaled so that one unit is the target's last mantissa bit, then rounded by nearbyint (the
// default rounding mode, to nearest even). A carry into the exponent falls out of the sum.
uint16_t ReferenceNarrow(float x, int mantissa_bits, int exponent_bias) {
  const uint16_t sign = std::signbit(x) ? (1u << 15) : 0;
  const uint16_t inf = static_cast<uint16_t>(((2 * exponent_bias + 1) << mantissa_bits));
  if (std::isnan(x)) return 0;  // Callers check NaN separately.
  const double ax = std::fabs(static_cast<double>(x));
  if (std::isinf(ax)) return sign | inf;
  const int min_exponent = 1 - exponent_bias;
  int e;
  std::frexp(ax, &e);
  --e;  // ax = 1.f * 2^e
  double q;
  uint32_t bits;
  if (ax == 0 || e < min_exponent) {
    q = std::nearbyint(std::ldexp(ax, mantissa_bits - min_exponent));
    bits = static_cast<uint32_t>(q);
  } else {
    q = std::nearbyint(std::ldexp(ax, mantissa_bits - e));
    bits = (static_cast<uint32_t>(e + exponent_bias) << mantissa_bits) + static_cast<uint32_t>(q) -
           (1u << mantissa_bits);
  }
  if (bits > inf) bits = inf;
  return sign | static_cast<uint16_t>(bits);
}

uint16_t ReferenceHalf(float x) { return ReferenceNarrow(x, 10, 15); }
uint16_t ReferenceBFloat16(float x) { return ReferenceNarrow(x, 7, 127); }

// The value of a binary16 pattern, from its fields.
double ReferenceHalfValue(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa == 0 ? sign * HUGE_VAL : NAN;
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

TEST(WireBytesPerElementTest, SizesOfFloatEncodings) {
  EXPECT_EQ(*WireBytesPerElement(v1::DT_FLOAT32), 4);
  EXPECT_EQ(*WireBytesPerElement(v1::DT_INVALID), 4);
  EXPECT_EQ(*WireBytesPerElement(v1::DT_FLOAT16), 2);
  EXPECT_EQ(*WireBytesPerElement(v1::DT_BFLOAT16), 2);
}

TEST(WireBytesPerElementTest, RejectsNonFloatDtypesByName) {
  absl::StatusOr<int> r = WireBytesPerElement(v1::DT_INT64);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("DT_INT64 (4)"));

  r = WireBytesPerElement(static_cast<v1::DataType>(99));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("wire dtype 99 "));
}

TEST(WireRelativeErrorTest, HalfUlpOfEachSignificand) {
  EXPECT_EQ(WireRelativeError(v1::DT_FLOAT32), 0.0);
  EXPECT_EQ(WireRelativeError(v1::DT_INVALID), 0.0);
  EXPECT_EQ(WireRelativeError(v1::DT_FLOAT16), std::ldexp(1.0, -11));
  EXPECT_EQ(WireRelativeError(v1::DT_BFLOAT16), std::ldexp(1.0, -8));
  EXPECT_EQ(WireRelativeError(v1::DT_INT64), std::numeric_limits<double>::infinity());
}

TEST(HalfEncodingTest, ExactValues) {
  constexpr v1::DataType kHalf = v1::DT_FLOAT16;
  EXPECT_EQ(Encode16(1.0f, kHalf), 0x3C00);
  EXPECT_EQ(Encode16(-2.0f, kHalf), 0xC000);
  EXPECT_EQ(Encode16(0.0f, kHalf), 0x0000);
  EXPECT_EQ(Encode16(-0.0f, kHalf), 0x8000);
  EXPECT_EQ(Encode16(65504.0f, kHalf), 0x7BFF);  // largest half
  EXPECT_EQ(Encode16(std::nextafter(65520.0f, 0.0f), kHalf), 0x7BFF);
  EXPECT_EQ(Encode16(65520.0f, kHalf), 0x7C00);  // the tie rounds to the even pattern: inf
  EXPECT_EQ(Encode16(-65520.0f, kHalf), 0xFC00);
  EXPECT_EQ(Encode16(1e10f, kHalf), 0x7C00);
  EXPECT_EQ(Encode16(std::numeric_limits<float>::max(), kHalf), 0x7C00);
  EXPECT_EQ(Encode16(kInf, kHalf), 0x7C00);
  EXPECT_EQ(Encode16(-kInf, kHalf), 0xFC00);
}

TEST(HalfEncodingTest, RoundsToNearestEven) {
  constexpr v1::DataType kHalf = v1::DT_FLOAT16;
  // 0.1f = 0x3DCCCCCD: the 13 dropped bits are 0xCCD, under half an ulp, so it rounds down.
  EXPECT_EQ(Encode16(0.1f, kHalf), 0x2E66);
  EXPECT_EQ(Encode16(-0.1f, kHalf), 0xAE66);
  // 1/3 = 0x3EAAAAAB: dropped 0x0AAB, down.  0.7f = 0x3F333333: dropped 0x1333, up.
  EXPECT_EQ(Encode16(1.0f / 3, kHalf), 0x3555);
  EXPECT_EQ(Encode16(0.7f, kHalf), 0x399A);
  // Exact ties go to the even mantissa.
  EXPECT_EQ(Encode16(1.0f + std::ldexp(1.0f, -11), kHalf), 0x3C00);
  EXPECT_EQ(Encode16(1.0f + 3 * std::ldexp(1.0f, -11), kHalf), 0x3C02);
  EXPECT_EQ(Encode16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f), kHalf), 0x3C01);
  // A carry out of the mantissa bumps the exponent: 2 - 2^-12 rounds up to 2.
  EXPECT_EQ(Encode16(2.0f - std::ldexp(1.0f, -12), kHalf), 0x4000);
}

TEST(HalfEncodingTest, Subnormals) {
  constexpr v1::DataType kHalf = v1::DT_FLOAT16;
  // 1e-8 is below half of the smallest subnormal (2^-24 ~ 5.96e-8): it rounds to zero.
  EXPECT_EQ(Encode16(1e-8f, kHalf), 0x0000);
  EXPECT_EQ(Encode16(-1e-8f, kHalf), 0x8000);
  EXPECT_EQ(Encode16(std::numeric_limits<float>::denorm_min(), kHalf), 0x0000);
  // 2^-25 is the tie between 0 and 2^-24 and goes to 0 (even); just above it rounds up.
  EXPECT_EQ(Encode16(std::ldexp(1.0f, -25), kHalf), 0x0000);
  EXPECT_EQ(Encode16(std::nextafter(std::ldexp(1.0f, -25), 1.0f), kHalf), 0x0001);
  EXPECT_EQ(Encode16(3e-8f, kHalf), 0x0001);
  EXPECT_EQ(Encode16(std::ldexp(1.0f, -24), kHalf), 0x0001);
  EXPECT_EQ(Encode16(3 * std::ldexp(1.0f, -25), kHalf), 0x0002);  // tie between 1 and 2
  EXPECT_EQ(Encode16(1e-6f, kHalf), 0x0011);                      // 16.78 steps of 2^-24
  EXPECT_EQ(Encode16(1023 * std::ldexp(1.0f, -24), kHalf), 0x03FF);
  // Halfway between the largest subnormal and the smallest normal: to even, the normal.
  EXPECT_EQ(Encode16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25), kHalf), 0x0400);
  EXPECT_EQ(Encode16(std::ldexp(1.0f, -14), kHalf), 0x0400);
}

TEST(HalfEncodingTest, NanStaysNan) {
  const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u,
                           0x7FFFFFFFu, 0x7F802000u, 0xFF800001u};
  for (uint32_t nan : nans) {
    const uint16_t h = Encode16(FromBits(nan), v1::DT_FLOAT16);
    EXPECT_TRUE(IsHalfNan(h)) << std::hex << nan << " -> " << h;
    EXPECT_EQ(h >> 15, nan >> 31) << std::hex << nan;
  }
  EXPECT_EQ(Encode16(std::numeric_limits<float>::quiet_NaN(), v1::DT_FLOAT16), 0x7E00);
}

TEST(HalfDecodingTest, ExactValues) {
  constexpr v1::DataType kHalf = v1::DT_FLOAT16;
  EXPECT_EQ(Decode16(0x3C00, kHalf), 1.0f);
  EXPECT_EQ(Decode16(0xC000, kHalf), -2.0f);
  EXPECT_EQ(Decode16(0x7BFF, kHalf), 65504.0f);
  EXPECT_EQ(Decode16(0x2E66, kHalf), 0.0999755859375f);
  EXPECT_EQ(Decode16(0x0001, kHalf), std::ldexp(1.0f, -24));
  EXPECT_EQ(Decode16(0x83FF, kHalf), -1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(Decode16(0x0400, kHalf), std::ldexp(1.0f, -14));
  EXPECT_EQ(Decode16(0x7C00, kHalf), kInf);
  EXPECT_EQ(Decode16(0xFC00, kHalf), -kInf);
  EXPECT_EQ(ToBits(Decode16(0x0000, kHalf)), 0x00000000u);
  EXPECT_EQ(ToBits(Decode16(0x8000, kHalf)), 0x80000000u);
  EXPECT_TRUE(std::isnan(Decode16(0x7E00, kHalf)));
  EXPECT_TRUE(std::isnan(Decode16(0x7C01, kHalf)));
  EXPECT_TRUE(std::isnan(Decode16(0xFFFF, kHalf)));
}

TEST(BFloat16EncodingTest, ExactValues) {
  constexpr v1::DataType kBf16 = v1::DT_BFLOAT16;
  EXPECT_EQ(Encode16(1.0f, kBf16), 0x3F80);
  EXPECT_EQ(Encode16(-2.0f, kBf16), 0xC000);
  EXPECT_EQ(Encode16(0.0f, kBf16), 0x0000);
  EXPECT_EQ(Encode16(-0.0f, kBf16), 0x8000);
  EXPECT_EQ(Encode16(65504.0f, kBf16), 0x4780);               // 65504 rounds up to 65536
  EXPECT_EQ(Encode16(FromBits(0x7F7F0000u), kBf16), 0x7F7F);  // largest bfloat16
  EXPECT_EQ(Encode16(std::numeric_limits<float>::max(), kBf16), 0x7F80);  // rounds to inf
  EXPECT_EQ(Encode16(-std::numeric_limits<float>::max(), kBf16), 0xFF80);
  EXPECT_EQ(Encode16(kInf, kBf16), 0x7F80);
  EXPECT_EQ(Encode16(-kInf, kBf16), 0xFF80);
  // 1e-8 = 0x322BCC77: a normal bfloat16; dropped 0xCC77, up.
  EXPECT_EQ(Encode16(1e-8f, kBf16), 0x322C);
  // Float subnormals stay subnormal: 0x00012345 -> 0x0001, 0x00018000 (tie) -> 0x0002.
  EXPECT_EQ(Encode16(FromBits(0x00012345u), kBf16), 0x0001);
  EXPECT_EQ(Encode16(FromBits(0x00018000u), kBf16), 0x0002);
}

TEST(BFloat16EncodingTest, RoundsToNearestEven) {
  constexpr v1::DataType kBf16 = v1::DT_BFLOAT16;
  // 0.1f = 0x3DCCCCCD: dropped 0xCCCD, over half, so it rounds up (fp16 rounds 0.1 down).
  EXPECT_EQ(Encode16(0.1f, kBf16), 0x3DCD);
  EXPECT_EQ(Encode16(-0.1f, kBf16), 0xBDCD);
  // Exact ties go to the even mantissa.
  EXPECT_EQ(Encode16(1.0f + std::ldexp(1.0f, -8), kBf16), 0x3F80);
  EXPECT_EQ(Encode16(1.0f + 3 * std::ldexp(1.0f, -8), kBf16), 0x3F82);
  EXPECT_EQ(Encode16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f), kBf16), 0x3F81);
  EXPECT_EQ(Encode16(2.0f - std::ldexp(1.0f, -9), kBf16), 0x4000);  // carry into the exponent
}

TEST(BFloat16EncodingTest, NanStaysNan) {
  // Truncating these would give inf (0x7F80) or lose the NaN: each must come out a NaN.
  const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u,
                           0x7F80FFFFu, 0x7FFFFFFFu, 0xFF800001u};
  for (uint32_t nan : nans) {
    const uint16_t h = Encode16(FromBits(nan), v1::DT_BFLOAT16);
    EXPECT_TRUE(IsBFloat16Nan(h)) << std::hex << nan << " -> " << h;
    EXPECT_EQ(h >> 15, nan >> 31) << std::hex << nan;
  }
  EXPECT_EQ(Encode16(std::numeric_limits<float>::quiet_NaN(), v1::DT_BFLOAT16), 0x7FC0);
}

TEST(BFloat16DecodingTest, ExactValues) {
  constexpr v1::DataType kBf16 = v1::DT_BFLOAT16;
  EXPECT_EQ(Decode16(0x3F80, kBf16), 1.0f);
  EXPECT_EQ(Decode16(0xC000, kBf16), -2.0f);
  EXPECT_EQ(Decode16(0x3DCD, kBf16), FromBits(0x3DCD0000u));
  EXPECT_EQ(Decode16(0x7F80, kBf16), kInf);
  EXPECT_EQ(Decode16(0xFF80, kBf16), -kInf);
  EXPECT_EQ(ToBits(Decode16(0x8000, kBf16)), 0x80000000u);
  EXPECT_TRUE(std::isnan(Decode16(0x7FC0, kBf16)));
  EXPECT_TRUE(std::isnan(Decode16(0x7F81, kBf16)));
}

// Every 16-bit pattern, decoded in one call and re-encoded in one call, comes back unchanged
// (a NaN comes back a NaN of the same sign). Also checks every decoded half value against its
// definition.
TEST(ExhaustiveTest, EveryHalfPatternRoundTrips) {
  std::vector<uint16_t> all(1 << 16);
  for (int i = 0; i < (1 << 16); ++i) all[i] = static_cast<uint16_t>(i);
  const std::vector<float> decoded = DecodeAll16(all, v1::DT_FLOAT16);
  const std::vector<uint16_t> encoded = EncodeAll16(decoded, v1::DT_FLOAT16);
  int mismatches = 0;
  for (int i = 0; i < (1 << 16); ++i) {
    const uint16_t h = all[i];
    bool ok;
    if (IsHalfNan(h)) {
      ok = std::isnan(decoded[i]) && IsHalfNan(encoded[i]) && (encoded[i] >> 15) == (h >> 15);
    } else {
      ok = encoded[i] == h && static_cast<double>(decoded[i]) == ReferenceHalfValue(h) &&
           std::signbit(decoded[i]) == ((h >> 15) != 0);
    }
    if (!ok && ++mismatches <= 10) {
      ADD_FAILURE() << std::hex << "half 0x" << h << " -> float 0x" << ToBits(decoded[i])
                    << " -> half 0x" << encoded[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(ExhaustiveTest, EveryBFloat16PatternRoundTrips) {
  std::vector<uint16_t> all(1 << 16);
  for (int i = 0; i < (1 << 16); ++i) all[i] = static_cast<uint16_t>(i);
  const std::vector<float> decoded = DecodeAll16(all, v1::DT_BFLOAT16);
  const std::vector<uint16_t> encoded = EncodeAll16(decoded, v1::DT_BFLOAT16);
  int mismatches = 0;
  for (int i = 0; i < (1 << 16); ++i) {
    const uint16_t h = all[i];
    bool ok;
    if (IsBFloat16Nan(h)) {
      ok = std::isnan(decoded[i]) && IsBFloat16Nan(encoded[i]) && (encoded[i] >> 15) == (h >> 15);
    } else {
      ok = encoded[i] == h && ToBits(decoded[i]) == static_cast<uint32_t>(h) << 16;
    }
    if (!ok && ++mismatches <= 10) {
      ADD_FAILURE() << std::hex << "bfloat16 0x" << h << " -> float 0x" << ToBits(decoded[i])
                    << " -> bfloat16 0x" << encoded[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// Random float bit patterns (every exponent, subnormals, inf and NaN included) against the
// slow reference encoders.
TEST(ExhaustiveTest, RandomFloatsMatchReferenceEncoders) {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<uint32_t> any_bits;
  // Dense around the half range too, where the interesting rounding happens.
  std::uniform_int_distribution<uint32_t> half_range(0x33000000u, 0x47800000u);
  std::vector<float> values(1 << 20);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits = (i % 2 == 0) ? any_bits(rng) : half_range(rng) | (any_bits(rng) & 0x80000000u);
    values[i] = FromBits(bits);
  }
  const std::vector<uint16_t> half = EncodeAll16(values, v1::DT_FLOAT16);
  const std::vector<uint16_t> bf16 = EncodeAll16(values, v1::DT_BFLOAT16);
  int mismatches = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const float x = values[i];
    const bool ok = std::isnan(x) ? IsHalfNan(half[i]) && IsBFloat16Nan(bf16[i])
                                  : half[i] == ReferenceHalf(x) && bf16[i] == ReferenceBFloat16(x);
    if (!ok && ++mismatches <= 10) {
      ADD_FAILURE() << std::hex << "float 0x" << ToBits(x) << ": half 0x" << half[i] << " (want 0x"
                    << ReferenceHalf(x) << "), bfloat16 0x" << bf16[i] << " (want 0x"
                    << ReferenceBFloat16(x) << ")";
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// 1M random values spread log-uniformly over the normal range of `dtype`, with random signs;
// the count is not a multiple of any block or vector width.
void ExpectRoundTripWithinBound(v1::DataType dtype, double min_exponent, double max_exponent) {
  std::mt19937 rng(static_cast<unsigned>(dtype) * 7919);
  std::uniform_real_distribution<double> exponent(min_exponent, max_exponent);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> values((1 << 20) + 37);
  for (float& v : values) {
    v = static_cast<float>(std::exp2(exponent(rng))) * (negative(rng) ? -1.0f : 1.0f);
  }
  std::string bytes;
  ASSERT_TRUE(EncodeFloats(values.data(), values.size(), dtype, &bytes).ok());
  std::vector<float> decoded(values.size());
  const absl::Status s = DecodeFloats(bytes, dtype, decoded.data(), decoded.size());
  ASSERT_TRUE(s.ok()) << s;
  const double bound = WireRelativeError(dtype);
  double worst = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double error = std::fabs(static_cast<double>(decoded[i]) - values[i]) /
                         std::fabs(static_cast<double>(values[i]));
    worst = std::max(worst, error);
    ASSERT_LE(error, bound) << "value " << values[i] << " decoded as " << decoded[i];
  }
  // The bound is tight: some value comes close to it.
  EXPECT_GT(worst, 0.9 * bound);
}

TEST(RoundTripTest, HalfWithinRelativeError) {
  // 2^-14 is the smallest normal half; 2^15.99 stays below 65504.
  ExpectRoundTripWithinBound(v1::DT_FLOAT16, -14, 15.99);
}

TEST(RoundTripTest, BFloat16WithinRelativeError) {
  ExpectRoundTripWithinBound(v1::DT_BFLOAT16, -126, 127.99);
}

TEST(RoundTripTest, Float32IsRawAndExact) {
  const std::vector<float> values = {
      1.0f, -0.0f, 0.1f, kInf, FromBits(0x7FA12345u), std::numeric_limits<float>::denorm_min()};
  for (v1::DataType dtype : {v1::DT_FLOAT32, v1::DT_INVALID}) {
    std::string bytes;
    ASSERT_TRUE(EncodeFloats(values.data(), values.size(), dtype, &bytes).ok());
    ASSERT_EQ(bytes.size(), 4 * values.size());
    EXPECT_EQ(std::memcmp(bytes.data(), values.data(), bytes.size()), 0);
    std::vector<float> decoded(values.size());
    ASSERT_TRUE(DecodeFloats(bytes, dtype, decoded.data(), decoded.size()).ok());
    EXPECT_EQ(std::memcmp(decoded.data(), values.data(), bytes.size()), 0);  // NaN payload too
  }
}

// Lengths around the block and vector widths, into and out of unaligned buffers, agree with
// encoding the elements one at a time.
TEST(RoundTripTest, AnyLengthAndAlignment) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (v1::DataType dtype : {v1::DT_FLOAT16, v1::DT_BFLOAT16, v1::DT_FLOAT32}) {
    const int width = *WireBytesPerElement(dtype);
    for (int n : {0, 1, 7, 8, 9, 511, 512, 513, 1031, 2048}) {
      std::vector<float> values(n);
      for (float& v : values) v = normal(rng);
      std::string buffer(1 + n * width, '\0');
      EncodeFloatsTo(values.data(), n, dtype, &buffer[1]);
      for (int i = 0; i < n; ++i) {
        std::string one;
        ASSERT_TRUE(EncodeFloats(&values[i], 1, dtype, &one).ok());
        ASSERT_EQ(buffer.substr(1 + i * width, width), one) << "n=" << n << " i=" << i;
      }
      std::vector<float> decoded(n + 1, -1.0f);
      ASSERT_TRUE(
          DecodeFloats(absl::string_view(buffer).substr(1), dtype, decoded.data() + 1, n).ok());
      EXPECT_EQ(decoded[0], -1.0f);  // nothing written outside out[0..n)
      for (int i = 0; i < n; ++i) {
        float one;
        ASSERT_TRUE(
            DecodeFloats(absl::string_view(buffer).substr(1 + i * width, width), dtype, &one, 1)
                .ok());
        ASSERT_EQ(ToBits(decoded[i + 1]), ToBits(one)) << "n=" << n << " i=" << i;
      }
    }
  }
}

TEST(EncodeFloatsTest, AppendsToExistingBytes) {
  const float values[] = {1.0f, -2.0f};
  std::string out = "ab";
  ASSERT_TRUE(EncodeFloats(values, 2, v1::DT_FLOAT16, &out).ok());
  EXPECT_EQ(out, std::string("ab\x00\x3C\x00\xC0", 6));
  ASSERT_TRUE(EncodeFloats(values, 1, v1::DT_BFLOAT16, &out).ok());
  EXPECT_EQ(out, std::string("ab\x00\x3C\x00\xC0\x80\x3F", 8));
  ASSERT_TRUE(EncodeFloats(nullptr, 0, v1::DT_FLOAT32, &out).ok());
  EXPECT_EQ(out.size(), 8u);
}

TEST(EncodeFloatsTest, RejectsBadDtypeAndCountLeavingOutputUnchanged) {
  const float values[] = {1.0f};
  std::string out = "keep";
  absl::Status s = EncodeFloats(values, 1, v1::DT_INT64, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("DT_INT64"));
  s = EncodeFloats(values, -1, v1::DT_FLOAT16, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element count -1"));
  EXPECT_EQ(out, "keep");
}

TEST(DecodeFloatsTest, RejectsWrongSizeSayingExpectedAndGot) {
  const std::string bytes(9, '\0');
  std::vector<float> out(5, 7.0f);
  absl::Status s = DecodeFloats(bytes, v1::DT_FLOAT16, out.data(), 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected 10 bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("DT_FLOAT16"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("got 9"));
  EXPECT_EQ(out, std::vector<float>(5, 7.0f));

  s = DecodeFloats(std::string(24, '\0'), v1::DT_FLOAT32, out.data(), 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected 20 bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("got 24"));

  s = DecodeFloats("", v1::DT_BFLOAT16, out.data(), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected 2 bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("got 0"));
}

TEST(DecodeFloatsTest, RejectsBadDtypeAndCount) {
  float out[2];
  absl::Status s = DecodeFloats(std::string(16, '\0'), v1::DT_INT64, out, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("DT_INT64"));
  s = DecodeFloats("", v1::DT_FLOAT16, out, -3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element count -3"));
  EXPECT_TRUE(DecodeFloats("", v1::DT_FLOAT16, nullptr, 0).ok());
}

TEST(WireCodecDeathTest, EncodeFloatsToAbortsOnUnsupportedDtype) {
  const float values[] = {1.0f};
  char out[8];
  EXPECT_DEATH(EncodeFloatsTo(values, 1, v1::DT_INT64, out), "DT_INT64");
}

}  // namespace
}  // namespace pscluster
