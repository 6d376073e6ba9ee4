#include "ps_server/initializer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "proto/model.pb.h"
#include "proto/tensor.pb.h"

namespace pscluster {
namespace {

using Kind = v1::InitializerSpec::Kind;

// Separates a dense variable's stream from a table's of the same name.
constexpr uint64_t kDenseDomain = 1;
constexpr uint64_t kTableDomain = 2;

// TensorFlow's truncated_normal redraws values at or beyond this many standard deviations.
constexpr double kTruncateStddevs = 2.0;

uint64_t StreamKey(uint64_t seed, absl::string_view name, uint64_t domain) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ Fnv1a64(name)) ^ domain);
}

// Philox4x32-10 (Random123's philox4x32_10): 128 random bits for `counter` under `key`.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, uint64_t key) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u;
  constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  uint32_t key0 = static_cast<uint32_t>(key);
  uint32_t key1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = uint64_t{kMultiplier0} * counter[0];
    const uint64_t product1 = uint64_t{kMultiplier1} * counter[2];
    counter = {
        static_cast<uint32_t>(product1 >> 32) ^ counter[1] ^ key0, static_cast<uint32_t>(product1),
        static_cast<uint32_t>(product0 >> 32) ^ counter[3] ^ key1, static_cast<uint32_t>(product0)};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// The random bits of one element: `position` is the element index (dense) or the key (table),
// `column` the position within a table row (0 for dense).
class ElementStream {
 public:
  ElementStream(uint64_t key, uint64_t position, uint32_t column)
      : key_(key), position_(position), column_(column) {}

  // U[0, 1) with 53 random bits, from draw `draw`.
  double Uniform(uint32_t draw) const {
    const std::array<uint32_t, 4> bits = Bits(draw);
    return static_cast<double>(To53Bits(bits[0], bits[1])) * 0x1.0p-53;
  }

  // N(0, 1) by Box-Muller from draw `draw`.
  double Normal(uint32_t draw) const {
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    const std::array<uint32_t, 4> bits = Bits(draw);
    // u1 in (0, 1], so that its log is finite; u2 in [0, 1). Both are exact in double.
    const double u1 = static_cast<double>(To53Bits(bits[0], bits[1]) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(To53Bits(bits[2], bits[3])) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
  }

 private:
  static uint64_t To53Bits(uint32_t high, uint32_t low) {
    return ((uint64_t{high} << 32) | low) >> 11;
  }

  std::array<uint32_t, 4> Bits(uint32_t draw) const {
    return Philox4x32(
        {static_cast<uint32_t>(position_), static_cast<uint32_t>(position_ >> 32), column_, draw},
        key_);
  }

  const uint64_t key_;
  const uint64_t position_;
  const uint32_t column_;
};

// Draws from a U[low, high) given in double; the float result stays below float(high) even
// where rounding would reach it.
float UniformFloat(const ElementStream& stream, double low, double high) {
  const float value = static_cast<float>(low + (high - low) * stream.Uniform(0));
  const float float_high = static_cast<float>(high);
  return value < float_high ? value
                            : std::nextafter(float_high, -std::numeric_limits<float>::infinity());
}

// Everything needed to produce one element, resolved once per call.
struct Sampler {
  Kind kind;
  float constant;
  double low;   // UNIFORM and GLOROT_UNIFORM.
  double high;  // UNIFORM and GLOROT_UNIFORM.
  double mean;
  double stddev;

  float Sample(const ElementStream& stream) const {
    switch (kind) {
      case v1::InitializerSpec::ZEROS:
      case v1::InitializerSpec::CONSTANT:
        return constant;
      case v1::InitializerSpec::UNIFORM:
      case v1::InitializerSpec::GLOROT_UNIFORM:
        return UniformFloat(stream, low, high);
      case v1::InitializerSpec::NORMAL:
        return static_cast<float>(mean + stddev * stream.Normal(0));
      case v1::InitializerSpec::TRUNCATED_NORMAL:
      case v1::InitializerSpec::HE_NORMAL:
        // Each draw is rejected with probability 4.6%, so this ends after about one draw.
        for (uint32_t draw = 0;; ++draw) {
          const double z = stream.Normal(draw);
          if (std::abs(z) < kTruncateStddevs) return static_cast<float>(mean + stddev * z);
        }
      default:
        return 0.0f;  // ValidateInitializer refuses every other kind.
    }
  }
};

// REQUIRES: ValidateInitializer(spec) is OK. For GLOROT_UNIFORM, fan_in + fan_out > 0; for
// HE_NORMAL, fan_in > 0.
Sampler MakeSampler(const v1::InitializerSpec& spec, double fan_in, double fan_out) {
  Sampler sampler = {spec.kind(), 0.0f, spec.min(), spec.max(), spec.mean(), spec.stddev()};
  if (spec.kind() == v1::InitializerSpec::CONSTANT) sampler.constant = spec.value();
  if (spec.kind() == v1::InitializerSpec::GLOROT_UNIFORM) {
    const double limit = std::sqrt(6.0 / (fan_in + fan_out));
    sampler.low = -limit;
    sampler.high = limit;
  }
  if (spec.kind() == v1::InitializerSpec::HE_NORMAL) {
    // Keras's he_normal: a normal truncated at two standard deviations loses variance; the
    // constant (the truncated unit normal's standard deviation) gives it back.
    sampler.mean = 0.0;
    sampler.stddev = std::sqrt(2.0 / fan_in) / 0.87962566103423978;
  }
  return sampler;
}

absl::Status CheckFinite(absl::string_view field, float value, const v1::InitializerSpec& spec) {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("InitializerSpec.", field, " must be finite for ",
                     v1::InitializerSpec::Kind_Name(spec.kind()), ", got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckStddev(const v1::InitializerSpec& spec) {
  PS_RETURN_IF_ERROR(CheckFinite("mean", spec.mean(), spec));
  if (!(spec.stddev() >= 0.0f) || !std::isfinite(spec.stddev())) {
    return absl::InvalidArgumentError(
        absl::StrCat("InitializerSpec.stddev must be a finite number >= 0 for ",
                     v1::InitializerSpec::Kind_Name(spec.kind()), ", got ", spec.stddev()));
  }
  return absl::OkStatus();
}

std::string ShapeString(const v1::TensorShape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape.dims(), ","), "]");
}

// Keras's fans (see initializer.h). REQUIRES: rank >= 1, no negative dimension.
void ComputeFans(const v1::TensorShape& shape, double* fan_in, double* fan_out) {
  const int rank = shape.dims_size();
  if (rank == 1) {
    *fan_in = *fan_out = static_cast<double>(shape.dims(0));
    return;
  }
  double receptive_field = 1.0;
  for (int i = 0; i < rank - 2; ++i) receptive_field *= static_cast<double>(shape.dims(i));
  *fan_in = receptive_field * static_cast<double>(shape.dims(rank - 2));
  *fan_out = receptive_field * static_cast<double>(shape.dims(rank - 1));
}

absl::Status CheckedNumElements(absl::string_view name, const v1::TensorShape& shape,
                                int64_t* num_elements) {
  bool has_zero_dim = false;
  for (int i = 0; i < shape.dims_size(); ++i) {
    if (shape.dims(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("variable '", name, "' has shape ",
                                                     ShapeString(shape), " with negative dim ",
                                                     shape.dims(i), " at index ", i));
    }
    has_zero_dim |= shape.dims(i) == 0;
  }
  // A zero dimension makes the product 0 even where the other dimensions would overflow.
  if (has_zero_dim) {
    *num_elements = 0;
    return absl::OkStatus();
  }
  int64_t total = 1;
  for (int64_t dim : shape.dims()) {
    if (total > std::numeric_limits<int64_t>::max() / dim) {
      return absl::InvalidArgumentError(absl::StrCat("variable '", name, "' has shape ",
                                                     ShapeString(shape),
                                                     " whose element count overflows int64"));
    }
    total *= dim;
  }
  *num_elements = total;
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateInitializer(const v1::InitializerSpec& spec) {
  switch (spec.kind()) {
    case v1::InitializerSpec::ZEROS:
    case v1::InitializerSpec::GLOROT_UNIFORM:
    case v1::InitializerSpec::HE_NORMAL:
      return absl::OkStatus();
    case v1::InitializerSpec::CONSTANT:
      return CheckFinite("value", spec.value(), spec);
    case v1::InitializerSpec::UNIFORM:
      PS_RETURN_IF_ERROR(CheckFinite("min", spec.min(), spec));
      PS_RETURN_IF_ERROR(CheckFinite("max", spec.max(), spec));
      if (!(spec.max() > spec.min())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "UNIFORM needs InitializerSpec.max > min, got min=", spec.min(), " max=", spec.max()));
      }
      return absl::OkStatus();
    case v1::InitializerSpec::NORMAL:
    case v1::InitializerSpec::TRUNCATED_NORMAL:
      return CheckStddev(spec);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("InitializerSpec.kind ", static_cast<int>(spec.kind()),
                       " is not a known kind (ZEROS, CONSTANT, UNIFORM, NORMAL, "
                       "TRUNCATED_NORMAL, GLOROT_UNIFORM or HE_NORMAL)"));
  }
}

absl::Status InitializeDense(const v1::InitializerSpec& spec, absl::string_view name,
                             const v1::TensorShape& full_shape, int64_t first_element, float* out,
                             int64_t n) {
  PS_RETURN_IF_ERROR(ValidateInitializer(spec));
  int64_t num_elements = 0;
  PS_RETURN_IF_ERROR(CheckedNumElements(name, full_shape, &num_elements));
  if (n < 0 || first_element < 0 || first_element > num_elements - n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot initialize ", n, " elements from element ", first_element, " of variable '", name,
        "', which has shape ", ShapeString(full_shape), " and ", num_elements, " elements"));
  }
  double fan_in = 0.0;
  double fan_out = 0.0;
  const bool fans = spec.kind() == v1::InitializerSpec::GLOROT_UNIFORM ||
                    spec.kind() == v1::InitializerSpec::HE_NORMAL;
  if (fans) {
    if (full_shape.dims_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          v1::InitializerSpec::Kind_Name(spec.kind()),
          " needs a variable of rank >= 1 to compute fans, but variable '", name, "' is a scalar"));
    }
    ComputeFans(full_shape, &fan_in, &fan_out);
  }
  // With no elements there is nothing to draw (and a fan-based scale may be undefined).
  if (n == 0) return absl::OkStatus();
  const Sampler sampler = MakeSampler(spec, fan_in, fan_out);
  const uint64_t key = StreamKey(spec.seed(), name, kDenseDomain);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = sampler.Sample(ElementStream(key, static_cast<uint64_t>(first_element + i), 0));
  }
  return absl::OkStatus();
}

absl::Status InitializeRow(const v1::InitializerSpec& spec, absl::string_view table, int64_t key,
                           int64_t dim, float* out) {
  PS_RETURN_IF_ERROR(ValidateInitializer(spec));
  if (dim < 0 || dim > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("row dim of table '", table, "' must be in [0, 2^31), got ", dim));
  }
  if (dim == 0) return absl::OkStatus();
  const double fans = static_cast<double>(dim);
  const Sampler sampler = MakeSampler(spec, fans, fans);
  const uint64_t stream_key = StreamKey(spec.seed(), table, kTableDomain);
  for (int64_t j = 0; j < dim; ++j) {
    out[j] = sampler.Sample(
        ElementStream(stream_key, static_cast<uint64_t>(key), static_cast<uint32_t>(j)));
  }
  return absl::OkStatus();
}

}  // namespace pscluster
