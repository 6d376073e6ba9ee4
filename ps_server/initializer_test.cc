#include "ps_server/initializer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "proto/model.pb.h"
#include "proto/tensor.pb.h"

namespace pscluster {
namespace {

v1::InitializerSpec ParseSpec(const std::string& text) {
  v1::InitializerSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec)) << text;
  return spec;
}

v1::TensorShape Shape(std::vector<int64_t> dims) {
  v1::TensorShape shape;
  for (int64_t dim : dims) shape.add_dims(dim);
  return shape;
}

int64_t NumElements(const v1::TensorShape& shape) {
  int64_t n = 1;
  for (int64_t dim : shape.dims()) n *= dim;
  return n;
}

// Elements [first, first + n) of the variable, or an empty vector (and a test failure).
std::vector<float> Dense(const v1::InitializerSpec& spec, const std::string& name,
                         const v1::TensorShape& shape, int64_t first, int64_t n) {
  std::vector<float> out(n);
  const absl::Status status = InitializeDense(spec, name, shape, first, out.data(), n);
  EXPECT_TRUE(status.ok()) << status;
  return status.ok() ? out : std::vector<float>();
}

std::vector<float> WholeVariable(const v1::InitializerSpec& spec, const std::string& name,
                                 const v1::TensorShape& shape) {
  return Dense(spec, name, shape, 0, NumElements(shape));
}

std::vector<float> Row(const v1::InitializerSpec& spec, const std::string& table, int64_t key,
                       int64_t dim) {
  std::vector<float> out(dim);
  const absl::Status status = InitializeRow(spec, table, key, dim, out.data());
  EXPECT_TRUE(status.ok()) << status;
  return status.ok() ? out : std::vector<float>();
}

struct Moments {
  double mean = 0.0;
  double stddev = 0.0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
};

Moments ComputeMoments(const std::vector<float>& values) {
  Moments m;
  double sum = 0.0;
  for (float v : values) {
    sum += v;
    m.min = std::min<double>(m.min, v);
    m.max = std::max<double>(m.max, v);
  }
  m.mean = sum / values.size();
  double squares = 0.0;
  for (float v : values) squares += (v - m.mean) * (v - m.mean);
  m.stddev = std::sqrt(squares / values.size());
  return m;
}

// Every kind, each with a non-default seed.
const char* const kAllKindSpecs[] = {
    "kind: ZEROS",
    "kind: CONSTANT value: 0.25",
    "kind: UNIFORM min: -1 max: 2 seed: 11",
    "kind: NORMAL mean: 0.5 stddev: 2 seed: 12",
    "kind: TRUNCATED_NORMAL mean: -1 stddev: 0.1 seed: 13",
    "kind: GLOROT_UNIFORM seed: 14",
    "kind: HE_NORMAL seed: 15",
};

class EveryKindTest : public testing::TestWithParam<const char*> {};

TEST_P(EveryKindTest, RowPartitionsEqualTheWholeVariable) {
  const v1::InitializerSpec spec = ParseSpec(GetParam());
  const v1::TensorShape shape = Shape({37, 13});
  const std::vector<float> whole = WholeVariable(spec, "dense/kernel", shape);
  ASSERT_EQ(whole.size(), 37u * 13u);

  // Rows [0, 5), [5, 6), [6, 30), [30, 37), as a fixed-size partitioner might cut them.
  std::vector<float> pieces;
  const int64_t row_bounds[] = {0, 5, 6, 30, 37};
  for (int p = 0; p + 1 < 5; ++p) {
    const std::vector<float> piece = Dense(spec, "dense/kernel", shape, row_bounds[p] * 13,
                                           (row_bounds[p + 1] - row_bounds[p]) * 13);
    pieces.insert(pieces.end(), piece.begin(), piece.end());
  }
  EXPECT_EQ(pieces, whole);
}

TEST_P(EveryKindTest, ArbitraryElementRangesEqualTheWholeVariable) {
  const v1::InitializerSpec spec = ParseSpec(GetParam());
  const v1::TensorShape shape = Shape({37, 13});
  const std::vector<float> whole = WholeVariable(spec, "dense/kernel", shape);
  std::vector<float> pieces;
  const int64_t bounds[] = {0, 1, 100, 101, 250, 481};
  for (int p = 0; p + 1 < 6; ++p) {
    const std::vector<float> piece =
        Dense(spec, "dense/kernel", shape, bounds[p], bounds[p + 1] - bounds[p]);
    pieces.insert(pieces.end(), piece.begin(), piece.end());
  }
  EXPECT_EQ(pieces, whole);
}

TEST_P(EveryKindTest, SameInputsGiveSameValues) {
  const v1::InitializerSpec spec = ParseSpec(GetParam());
  EXPECT_EQ(WholeVariable(spec, "w", Shape({20, 30})), WholeVariable(spec, "w", Shape({20, 30})));
  EXPECT_EQ(Row(spec, "emb", 42, 16), Row(spec, "emb", 42, 16));
}

TEST_P(EveryKindTest, RowsAreFilledAndWithinKindBounds) {
  const v1::InitializerSpec spec = ParseSpec(GetParam());
  for (int64_t key :
       {int64_t{0}, int64_t{-5}, int64_t{1} << 40, std::numeric_limits<int64_t>::min()}) {
    for (float value : Row(spec, "emb", key, 8)) EXPECT_TRUE(std::isfinite(value)) << key;
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, EveryKindTest, testing::ValuesIn(kAllKindSpecs));

// The random kinds: values must change with the seed, the name and the key.
const char* const kRandomKindSpecs[] = {
    "kind: UNIFORM min: -1 max: 2",
    "kind: NORMAL mean: 0 stddev: 1",
    "kind: TRUNCATED_NORMAL mean: 0 stddev: 1",
    "kind: GLOROT_UNIFORM",
};

class RandomKindTest : public testing::TestWithParam<const char*> {};

// How many positions hold equal values.
int CountEqual(const std::vector<float>& a, const std::vector<float>& b) {
  int equal = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) equal += a[i] == b[i];
  return equal;
}

TEST_P(RandomKindTest, DifferentSeedGivesDifferentValues) {
  v1::InitializerSpec spec = ParseSpec(GetParam());
  spec.set_seed(1);
  const std::vector<float> seed1 = WholeVariable(spec, "w", Shape({64, 16}));
  spec.set_seed(2);
  const std::vector<float> seed2 = WholeVariable(spec, "w", Shape({64, 16}));
  EXPECT_LT(CountEqual(seed1, seed2), 5);
}

TEST_P(RandomKindTest, DifferentNameGivesDifferentValues) {
  const v1::InitializerSpec spec = ParseSpec(GetParam());
  EXPECT_LT(CountEqual(WholeVariable(spec, "layer1/w", Shape({64, 16})),
                       WholeVariable(spec, "layer2/w", Shape({64, 16}))),
            5);
}

TEST_P(RandomKindTest, ElementsWithinAVariableDiffer) {
  const std::vector<float> values = WholeVariable(ParseSpec(GetParam()), "w", Shape({1024}));
  std::vector<float> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 1000);
}

TEST_P(RandomKindTest, RowsDependOnKeyAndTable) {
  const v1::InitializerSpec spec = ParseSpec(GetParam());
  const std::vector<float> row = Row(spec, "emb", 7, 32);
  EXPECT_LT(CountEqual(row, Row(spec, "emb", 8, 32)), 2);
  EXPECT_LT(CountEqual(row, Row(spec, "emb", -7, 32)), 2);
  EXPECT_LT(CountEqual(row, Row(spec, "other_emb", 7, 32)), 2);
  v1::InitializerSpec reseeded = spec;
  reseeded.set_seed(spec.seed() + 1);
  EXPECT_LT(CountEqual(row, Row(reseeded, "emb", 7, 32)), 2);
}

TEST_P(RandomKindTest, TableRowsAndDenseElementsUseSeparateStreams) {
  // Element i of variable "x" and key i of table "x" are drawn from different streams.
  const v1::InitializerSpec spec = ParseSpec(GetParam());
  std::vector<float> first_elements = Dense(spec, "x", Shape({64}), 0, 64);
  std::vector<float> rows;
  for (int64_t key = 0; key < 64; ++key) rows.push_back(Row(spec, "x", key, 64)[0]);
  EXPECT_LT(CountEqual(first_elements, rows), 3);
}

INSTANTIATE_TEST_SUITE_P(RandomKinds, RandomKindTest, testing::ValuesIn(kRandomKindSpecs));

TEST(InitializerTest, ZerosAndConstant) {
  for (float v : WholeVariable(ParseSpec("kind: ZEROS seed: 3"), "b", Shape({10}))) {
    EXPECT_EQ(v, 0.0f);
  }
  for (float v : WholeVariable(ParseSpec("kind: CONSTANT value: -1.5"), "b", Shape({2, 5}))) {
    EXPECT_EQ(v, -1.5f);
  }
  for (float v : Row(ParseSpec("kind: CONSTANT value: 0.125"), "emb", 3, 4)) {
    EXPECT_EQ(v, 0.125f);
  }
}

TEST(InitializerTest, ScalarVariableHasOneElement) {
  const v1::InitializerSpec spec = ParseSpec("kind: NORMAL mean: 3 stddev: 0.5 seed: 1");
  const std::vector<float> scalar = Dense(spec, "global_scale", Shape({}), 0, 1);
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_NE(scalar[0], 3.0f);
  EXPECT_EQ(Dense(spec, "global_scale", Shape({}), 0, 1), scalar);
}

TEST(InitializerTest, EmptyVariablesAndRowsNeedNoOutput) {
  const v1::InitializerSpec glorot = ParseSpec("kind: GLOROT_UNIFORM");
  EXPECT_TRUE(InitializeDense(glorot, "empty", Shape({0, 5}), 0, nullptr, 0).ok());
  EXPECT_TRUE(InitializeDense(glorot, "empty", Shape({0}), 0, nullptr, 0).ok());
  EXPECT_TRUE(InitializeDense(glorot, "w", Shape({4, 5}), 20, nullptr, 0).ok());
  EXPECT_TRUE(InitializeRow(glorot, "emb", 1, 0, nullptr).ok());
}

// Pins the generator: these are every model's initial values, so a change here changes what
// every run without a checkpoint starts from. The expected values were also reproduced by an
// independent Python transcription of the algorithm initializer.h documents.
TEST(InitializerTest, GoldenValues) {
  const std::vector<float> uniform =
      Dense(ParseSpec("kind: UNIFORM min: 0 max: 1 seed: 42"), "golden", Shape({4}), 0, 4);
  const std::vector<float> normal =
      Dense(ParseSpec("kind: NORMAL mean: 0 stddev: 1 seed: 42"), "golden", Shape({4}), 0, 4);
  const std::vector<float> row =
      Row(ParseSpec("kind: UNIFORM min: 0 max: 1 seed: 42"), "golden", 1234567, 4);
  const std::vector<float> expected_uniform = {0.412925094f, 0.446128607f, 0.469005167f,
                                               0.936784685f};
  const std::vector<float> expected_normal = {-1.12373412f, -1.02412176f, -0.00848903507f,
                                              0.338587791f};
  const std::vector<float> expected_row = {0.717114687f, 0.758265018f, 0.817303538f, 0.300332397f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(uniform[i], expected_uniform[i]) << i;
    EXPECT_EQ(row[i], expected_row[i]) << i;
    // log, cos and sqrt come from the C library; allow its last-bit differences.
    EXPECT_FLOAT_EQ(normal[i], expected_normal[i]) << i;
  }
}

// Statistics over 100k draws. Tolerances are at least five standard errors.
constexpr int64_t kDraws = 100000;

TEST(InitializerStatisticsTest, Uniform) {
  const std::vector<float> values =
      WholeVariable(ParseSpec("kind: UNIFORM min: -1 max: 2 seed: 5"), "u", Shape({kDraws}));
  const Moments m = ComputeMoments(values);
  EXPECT_GE(m.min, -1.0);
  EXPECT_LT(m.max, 2.0);
  EXPECT_NEAR(m.min, -1.0, 1e-3);
  EXPECT_NEAR(m.max, 2.0, 1e-3);
  EXPECT_NEAR(m.mean, 0.5, 0.015);                     // standard error 0.0027
  EXPECT_NEAR(m.stddev, 3.0 / std::sqrt(12.0), 0.01);  // 0.866, standard error 0.0019
  // Ten equal bins hold 10% each (standard error 95 draws).
  std::vector<int> bins(10, 0);
  for (float v : values) ++bins[std::min(9, static_cast<int>((v + 1.0f) / 3.0f * 10))];
  for (int b = 0; b < 10; ++b) EXPECT_NEAR(bins[b], kDraws / 10, 500) << "bin " << b;
}

TEST(InitializerStatisticsTest, Normal) {
  const std::vector<float> values =
      WholeVariable(ParseSpec("kind: NORMAL mean: 0.5 stddev: 2 seed: 6"), "n", Shape({kDraws}));
  const Moments m = ComputeMoments(values);
  EXPECT_NEAR(m.mean, 0.5, 0.035);    // standard error 0.0063
  EXPECT_NEAR(m.stddev, 2.0, 0.025);  // standard error 0.0045
  int within_one_stddev = 0;
  for (float v : values) within_one_stddev += std::abs(v - 0.5f) < 2.0f;
  EXPECT_NEAR(static_cast<double>(within_one_stddev) / kDraws, 0.6827, 0.008);
  // Unlike the truncated kind, some draws lie beyond three standard deviations (0.27%).
  EXPECT_LT(m.min, 0.5 - 3 * 2.0);
  EXPECT_GT(m.max, 0.5 + 3 * 2.0);
}

TEST(InitializerStatisticsTest, TruncatedNormalStaysWithinTwoStddevs) {
  const std::vector<float> values = WholeVariable(
      ParseSpec("kind: TRUNCATED_NORMAL mean: 1 stddev: 0.5 seed: 7"), "t", Shape({kDraws}));
  const Moments m = ComputeMoments(values);
  EXPECT_GE(m.min, 1.0 - 2 * 0.5);
  EXPECT_LE(m.max, 1.0 + 2 * 0.5);
  // Draws come close to the bounds: beyond 1.9 stddevs is ~0.5% of draws.
  EXPECT_LT(m.min, 1.0 - 1.9 * 0.5);
  EXPECT_GT(m.max, 1.0 + 1.9 * 0.5);
  EXPECT_NEAR(m.mean, 1.0, 0.008);  // standard error 0.0014
  // A standard normal truncated to (-2, 2) has stddev 0.87962.
  EXPECT_NEAR(m.stddev, 0.5 * 0.87962, 0.006);
}

struct GlorotCase {
  std::vector<int64_t> dims;
  double fan_in;
  double fan_out;
};

std::ostream& operator<<(std::ostream& os, const GlorotCase& c) {
  return os << Shape(c.dims).ShortDebugString();
}

class GlorotTest : public testing::TestWithParam<GlorotCase> {};

TEST_P(GlorotTest, UniformWithinKerasLimit) {
  const double limit = std::sqrt(6.0 / (GetParam().fan_in + GetParam().fan_out));
  const std::vector<float> values =
      WholeVariable(ParseSpec("kind: GLOROT_UNIFORM seed: 8"), "g", Shape(GetParam().dims));
  const Moments m = ComputeMoments(values);
  EXPECT_GE(m.min, -limit);
  EXPECT_LT(m.max, limit);
  EXPECT_LT(m.min, -0.99 * limit);
  EXPECT_GT(m.max, 0.99 * limit);
  EXPECT_NEAR(m.mean, 0.0, 0.012 * limit);
  EXPECT_NEAR(m.stddev, limit / std::sqrt(3.0), 0.01 * limit);
}

INSTANTIATE_TEST_SUITE_P(
    KerasFans, GlorotTest,
    testing::Values(GlorotCase{{kDraws}, kDraws, kDraws},                  // 1-D: both = dim0
                    GlorotCase{{400, 250}, 400, 250},                      // [in, out]
                    GlorotCase{{250, 400}, 250, 400},                      //
                    GlorotCase{{3, 3, 64, 128}, 3 * 3 * 64, 3 * 3 * 128},  // conv kernel
                    GlorotCase{{5, 4, 50, 100}, 5 * 4 * 50, 5 * 4 * 100}));

TEST(InitializerStatisticsTest, GlorotRowsUseTheRowAsA1DShape) {
  const v1::InitializerSpec spec = ParseSpec("kind: GLOROT_UNIFORM seed: 9");
  constexpr int64_t kDim = 64;
  const double limit = std::sqrt(6.0 / (kDim + kDim));
  std::vector<float> values;
  for (int64_t key = 0; key < kDraws / kDim; ++key) {
    const std::vector<float> row = Row(spec, "emb", key * 7919, kDim);
    values.insert(values.end(), row.begin(), row.end());
  }
  const Moments m = ComputeMoments(values);
  EXPECT_GE(m.min, -limit);
  EXPECT_LT(m.max, limit);
  EXPECT_LT(m.min, -0.99 * limit);
  EXPECT_GT(m.max, 0.99 * limit);
  EXPECT_NEAR(m.stddev, limit / std::sqrt(3.0), 0.01 * limit);
}

TEST(InitializerStatisticsTest, HeNormalHasKerasStddevOverFanIn) {
  // A 3x3 convolution from 16 to 64 channels: fan_in = 3 * 3 * 16.
  const v1::InitializerSpec spec = ParseSpec("kind: HE_NORMAL seed: 16");
  const std::vector<float> values = WholeVariable(spec, "conv/kernel", Shape({3, 3, 16, 2048}));
  const double stddev = std::sqrt(2.0 / (3 * 3 * 16));
  const Moments m = ComputeMoments(values);
  EXPECT_NEAR(m.mean, 0.0, 0.01 * stddev);
  // Keras divides by the truncated unit normal's stddev, so the result has stddev(2 / fan_in).
  EXPECT_NEAR(m.stddev, stddev, 0.01 * stddev);
  // Truncated at two of the untruncated normal's standard deviations.
  const double bound = 2.0 * stddev / 0.87962566103423978;
  EXPECT_GE(m.min, -bound);
  EXPECT_LE(m.max, bound);
  EXPECT_LT(m.min, -0.99 * bound);
}

TEST(InitializerStatisticsTest, NormalRowsAcrossKeys) {
  const v1::InitializerSpec spec = ParseSpec("kind: NORMAL mean: 0 stddev: 0.05 seed: 10");
  std::vector<float> values;
  for (int64_t key = -500; key < 500; ++key) {
    const std::vector<float> row = Row(spec, "emb", key, 100);
    values.insert(values.end(), row.begin(), row.end());
  }
  const Moments m = ComputeMoments(values);
  EXPECT_NEAR(m.mean, 0.0, 0.001);      // standard error 0.00016
  EXPECT_NEAR(m.stddev, 0.05, 0.0006);  // standard error 0.00011
}

struct BadSpecCase {
  std::string spec;
  std::string message_substring;
};

std::ostream& operator<<(std::ostream& os, const BadSpecCase& c) {
  return os << "'" << c.spec << "'";
}

class BadSpecTest : public testing::TestWithParam<BadSpecCase> {};

TEST_P(BadSpecTest, EveryEntryPointRefusesIt) {
  const v1::InitializerSpec spec = ParseSpec(GetParam().spec);
  const absl::Status validated = ValidateInitializer(spec);
  EXPECT_EQ(validated.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(validated.message(), GetParam().message_substring)) << validated;

  float out[4] = {7.0f, 7.0f, 7.0f, 7.0f};
  const absl::Status dense = InitializeDense(spec, "w", Shape({2, 2}), 0, out, 4);
  EXPECT_EQ(dense.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(dense.message(), GetParam().message_substring)) << dense;
  const absl::Status row = InitializeRow(spec, "emb", 1, 4, out);
  EXPECT_EQ(row.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(row.message(), GetParam().message_substring)) << row;
  for (float v : out) EXPECT_EQ(v, 7.0f);  // Untouched.
}

INSTANTIATE_TEST_SUITE_P(
    AllRules, BadSpecTest,
    testing::Values(
        BadSpecCase{"kind: UNIFORM min: 1 max: 1",
                    "UNIFORM needs InitializerSpec.max > min, got "
                    "min=1 max=1"},
        BadSpecCase{"kind: UNIFORM min: 2 max: -3", "got min=2 max=-3"},
        BadSpecCase{"kind: UNIFORM", "got min=0 max=0"},
        BadSpecCase{"kind: UNIFORM min: nan max: 1",
                    "InitializerSpec.min must be finite for UNIFORM, got nan"},
        BadSpecCase{"kind: UNIFORM min: 0 max: inf",
                    "InitializerSpec.max must be finite for UNIFORM, got inf"},
        BadSpecCase{"kind: NORMAL stddev: -1",
                    "InitializerSpec.stddev must be a finite number >= 0 for NORMAL, got -1"},
        BadSpecCase{"kind: NORMAL stddev: nan",
                    "stddev must be a finite number >= 0 for NORMAL, "
                    "got nan"},
        BadSpecCase{"kind: NORMAL mean: -inf stddev: 1",
                    "InitializerSpec.mean must be finite for NORMAL, got -inf"},
        BadSpecCase{"kind: TRUNCATED_NORMAL stddev: -0.5",
                    "stddev must be a finite number >= 0 for TRUNCATED_NORMAL, got -0.5"},
        BadSpecCase{"kind: TRUNCATED_NORMAL stddev: inf", "for TRUNCATED_NORMAL, got inf"},
        BadSpecCase{"kind: CONSTANT value: inf",
                    "InitializerSpec.value must be finite for CONSTANT, got inf"},
        BadSpecCase{"kind: CONSTANT value: nan", "InitializerSpec.value must be finite"}));

TEST(InitializerErrorTest, UnknownKind) {
  v1::InitializerSpec spec;
  spec.set_kind(static_cast<v1::InitializerSpec::Kind>(42));
  const absl::Status status = ValidateInitializer(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "InitializerSpec.kind 42 is not a known kind"))
      << status;
}

void ExpectDenseError(const v1::InitializerSpec& spec, const v1::TensorShape& shape, int64_t first,
                      int64_t n, const std::string& message_substring) {
  std::vector<float> out(4, 7.0f);
  const absl::Status status = InitializeDense(spec, "w", shape, first, out.data(), n);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), message_substring)) << status;
  EXPECT_EQ(out, std::vector<float>(4, 7.0f));
}

TEST(InitializerErrorTest, GlorotOnAScalar) {
  ExpectDenseError(ParseSpec("kind: GLOROT_UNIFORM"), Shape({}), 0, 1,
                   "GLOROT_UNIFORM needs a variable of rank >= 1 to compute fans, but variable "
                   "'w' is a scalar");
}

TEST(InitializerErrorTest, BadShapes) {
  const v1::InitializerSpec spec = ParseSpec("kind: NORMAL stddev: 1");
  ExpectDenseError(spec, Shape({3, -2}), 0, 0,
                   "variable 'w' has shape [3,-2] with negative dim -2 at index 1");
  ExpectDenseError(spec, Shape({int64_t{1} << 32, int64_t{1} << 32}), 0, 1,
                   "whose element count overflows int64");
}

TEST(InitializerErrorTest, RangesOutsideTheVariable) {
  const v1::InitializerSpec spec = ParseSpec("kind: NORMAL stddev: 1");
  ExpectDenseError(spec, Shape({2, 2}), 2, 3,
                   "cannot initialize 3 elements from element 2 of variable 'w', which has shape "
                   "[2,2] and 4 elements");
  ExpectDenseError(spec, Shape({2, 2}), -1, 2, "from element -1");
  ExpectDenseError(spec, Shape({2, 2}), 0, -1, "cannot initialize -1 elements");
  ExpectDenseError(spec, Shape({2, 2}), std::numeric_limits<int64_t>::max(), 2,
                   "cannot initialize 2 elements");
}

TEST(InitializerErrorTest, BadRowDim) {
  const v1::InitializerSpec spec = ParseSpec("kind: NORMAL stddev: 1");
  float out[1] = {7.0f};
  absl::Status status = InitializeRow(spec, "emb", 1, -1, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(status.message(), "row dim of table 'emb' must be in [0, 2^31), got -1"))
      << status;
  status = InitializeRow(spec, "emb", 1, int64_t{1} << 31, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "got 2147483648")) << status;
  EXPECT_EQ(out[0], 7.0f);
}

}  // namespace
}  // namespace pscluster
