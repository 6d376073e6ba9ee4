// The conformance tests of every Kernels backend. Each expected value comes from a plain
// double-precision loop written here, never from a backend's own code.

#include "kernels/kernels_test_body.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"

namespace pscluster {

void KernelsConformanceTest::SetUp() {
  absl::StatusOr<std::unique_ptr<Kernels>> kernels = GetParam().create();
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  kernels_ = std::move(kernels).value();
}

void KernelsConformanceTest::TearDown() {
  if (kernels_ == nullptr) return;
  for (void* p : owned_) kernels_->Free(p);
  owned_.clear();
}

float* KernelsConformanceTest::Upload(const std::vector<float>& values) {
  absl::StatusOr<float*> p = kernels_->AllocateFloats(values.size());
  if (!p.ok()) {
    ADD_FAILURE() << "AllocateFloats(" << values.size() << "): " << p.status();
    return nullptr;
  }
  owned_.push_back(*p);
  kernels_->CopyToDevice(values.data(), *p, values.size());
  return *p;
}

int32_t* KernelsConformanceTest::UploadInts(const std::vector<int32_t>& values) {
  absl::StatusOr<int32_t*> p = kernels_->AllocateInts(values.size());
  if (!p.ok()) {
    ADD_FAILURE() << "AllocateInts(" << values.size() << "): " << p.status();
    return nullptr;
  }
  owned_.push_back(*p);
  kernels_->CopyToDevice(values.data(), *p, values.size());
  return *p;
}

float* KernelsConformanceTest::Filled(int64_t n, float value) {
  return Upload(std::vector<float>(n, value));
}

std::vector<float> KernelsConformanceTest::Download(const float* device, int64_t n) {
  std::vector<float> host(n);
  kernels_->CopyToHost(device, host.data(), n);
  return host;
}

std::vector<int32_t> KernelsConformanceTest::DownloadInts(const int32_t* device, int64_t n) {
  std::vector<int32_t> host(n);
  kernels_->CopyToHostInts(device, host.data(), n);
  return host;
}

namespace {

constexpr double kRelTol = 1e-5;
constexpr double kAbsTol = 1e-6;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Passes when |actual[i] - expected[i]| <= tolerance[i] for every i; otherwise lists the
// first few elements that are off.
testing::AssertionResult AllWithin(const std::vector<float>& actual,
                                   const std::vector<double>& expected,
                                   const std::vector<double>& tolerance) {
  if (actual.size() != expected.size()) {
    return testing::AssertionFailure()
           << "size " << actual.size() << ", expected " << expected.size();
  }
  int misses = 0;
  std::string report;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(static_cast<double>(actual[i]) - expected[i]);
    if (error <= tolerance[i]) continue;  // false for NaN
    if (++misses <= 5) {
      absl::StrAppend(&report, "\n  [", i, "] = ", actual[i], ", expected ", expected[i],
                      " (error ", error, ", tolerance ", tolerance[i], ")");
    }
  }
  if (misses == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << misses << " of " << actual.size() << " off:" << report;
}

testing::AssertionResult AllNear(const std::vector<float>& actual,
                                 const std::vector<double>& expected, double rel_tol = kRelTol,
                                 double abs_tol = kAbsTol) {
  std::vector<double> tolerance(expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    tolerance[i] = abs_tol + rel_tol * std::abs(expected[i]);
  }
  return AllWithin(actual, expected, tolerance);
}

// c = alpha * op(a) * op(b) + beta * c, and for each element the sum of the magnitudes of its
// terms: float rounding error grows with that sum, not with the (possibly cancelled) result.
struct GemmReference {
  std::vector<double> c;
  std::vector<double> magnitude;
};

GemmReference ReferenceGemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha,
                            const std::vector<float>& a, const std::vector<float>& b, double beta,
                            const std::vector<float>& c) {
  GemmReference ref;
  ref.c.resize(static_cast<size_t>(m) * n);
  ref.magnitude.resize(ref.c.size());
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      double magnitude = 0;
      for (int p = 0; p < k; ++p) {
        const double av = trans_a ? a[p * m + i] : a[i * k + p];
        const double bv = trans_b ? b[j * k + p] : b[p * n + j];
        sum += av * bv;
        magnitude += std::abs(av * bv);
      }
      const double old = beta == 0 ? 0.0 : beta * c[i * n + j];
      ref.c[i * n + j] = alpha * sum + old;
      ref.magnitude[i * n + j] = std::abs(alpha) * magnitude + std::abs(old);
    }
  }
  return ref;
}

std::vector<double> ScaledTolerance(const std::vector<double>& magnitude, double rel_tol) {
  std::vector<double> tolerance(magnitude.size());
  for (size_t i = 0; i < magnitude.size(); ++i) tolerance[i] = kAbsTol + rel_tol * magnitude[i];
  return tolerance;
}

const char* ActivationName(Activation f) {
  switch (f) {
    case Activation::kLinear:
      return "linear";
    case Activation::kRelu:
      return "relu";
    case Activation::kSigmoid:
      return "sigmoid";
    case Activation::kTanh:
      return "tanh";
  }
  return "?";
}

constexpr Activation kAllActivations[] = {Activation::kLinear, Activation::kRelu,
                                          Activation::kSigmoid, Activation::kTanh};

double ReferenceActivation(Activation f, double x) {
  switch (f) {
    case Activation::kLinear:
      return x;
    case Activation::kRelu:
      return x > 0 ? x : 0.0;
    case Activation::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case Activation::kTanh:
      return std::tanh(x);
  }
  return 0;
}

// f'(x) from y = f(x), as kernels.h specifies.
double ReferenceDerivativeFromOutput(Activation f, double y) {
  switch (f) {
    case Activation::kLinear:
      return 1.0;
    case Activation::kRelu:
      return y > 0 ? 1.0 : 0.0;
    case Activation::kSigmoid:
      return y * (1.0 - y);
    case Activation::kTanh:
      return 1.0 - y * y;
  }
  return 0;
}

// Inputs that reach every region of the activations: saturation, zero, tiny values.
std::vector<float> ActivationInputs() {
  std::vector<float> x = RandomFloats(200, 11, -6.0f, 6.0f);
  for (float v : {-100.0f, -50.0f, -20.0f, -1e-3f, 0.0f, 1e-3f, 20.0f, 50.0f, 100.0f}) {
    x.push_back(v);
  }
  return x;
}

TEST_P(KernelsConformanceTest, GemmMatchesReferenceForAllTransposes) {
  const int m = 37, n = 53, k = 29;
  const float alpha = 0.75f, beta = -0.5f;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      SCOPED_TRACE(absl::StrCat("trans_a=", trans_a, " trans_b=", trans_b));
      const std::vector<float> a = RandomFloats(m * k, 1);
      const std::vector<float> b = RandomFloats(k * n, 2);
      const std::vector<float> c0 = RandomFloats(m * n, 3);
      float* c = Upload(c0);
      kernels_->Gemm(trans_a, trans_b, m, n, k, alpha, Upload(a), Upload(b), beta, c);
      const GemmReference ref = ReferenceGemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c0);
      EXPECT_TRUE(AllWithin(Download(c, m * n), ref.c, ScaledTolerance(ref.magnitude, 1e-5)));
    }
  }
}

TEST_P(KernelsConformanceTest, GemmWithLongInnerDimension) {
  const int m = 9, n = 7, k = 4099;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      SCOPED_TRACE(absl::StrCat("trans_a=", trans_a, " trans_b=", trans_b));
      const std::vector<float> a = RandomFloats(m * k, 4);
      const std::vector<float> b = RandomFloats(k * n, 5);
      const std::vector<float> c0 = RandomFloats(m * n, 6);
      float* c = Upload(c0);
      kernels_->Gemm(trans_a, trans_b, m, n, k, 1.0f, Upload(a), Upload(b), 1.0f, c);
      const GemmReference ref = ReferenceGemm(trans_a, trans_b, m, n, k, 1.0, a, b, 1.0, c0);
      EXPECT_TRUE(AllWithin(Download(c, m * n), ref.c, ScaledTolerance(ref.magnitude, 1e-4)));
    }
  }
}

TEST_P(KernelsConformanceTest, GemmWithZeroBetaDoesNotReadC) {
  const int m = 5, n = 6, k = 7;
  const std::vector<float> a = RandomFloats(m * k, 7);
  const std::vector<float> b = RandomFloats(k * n, 8);
  float* c = Filled(m * n, kNaN);
  kernels_->Gemm(false, false, m, n, k, 2.0f, Upload(a), Upload(b), 0.0f, c);
  const GemmReference ref =
      ReferenceGemm(false, false, m, n, k, 2.0, a, b, 0.0, std::vector<float>(m * n));
  EXPECT_TRUE(AllWithin(Download(c, m * n), ref.c, ScaledTolerance(ref.magnitude, 1e-5)));
}

TEST_P(KernelsConformanceTest, GemmWithEmptyInnerDimensionScalesC) {
  const int m = 4, n = 3;
  const std::vector<float> c0 = RandomFloats(m * n, 9);
  float* a = Filled(1, 0.0f);
  float* b = Filled(1, 0.0f);
  float* c = Upload(c0);
  kernels_->Gemm(false, false, m, n, 0, 1.0f, a, b, -2.0f, c);
  std::vector<double> expected(m * n);
  for (int i = 0; i < m * n; ++i) expected[i] = -2.0 * c0[i];
  EXPECT_TRUE(AllNear(Download(c, m * n), expected));

  float* nan_c = Filled(m * n, kNaN);
  kernels_->Gemm(true, true, m, n, 0, 1.0f, a, b, 0.0f, nan_c);
  EXPECT_TRUE(AllNear(Download(nan_c, m * n), std::vector<double>(m * n, 0.0)));
}

TEST_P(KernelsConformanceTest, AddBias) {
  const int rows = 7, cols = 33;
  const std::vector<float> x0 = RandomFloats(rows * cols, 10);
  const std::vector<float> bias = RandomFloats(cols, 11);
  float* x = Upload(x0);
  kernels_->AddBias(Upload(bias), rows, cols, x);
  std::vector<double> expected(rows * cols);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      expected[r * cols + c] = double{x0[r * cols + c]} + bias[c];
    }
  }
  EXPECT_TRUE(AllNear(Download(x, rows * cols), expected));
}

TEST_P(KernelsConformanceTest, BiasGradSumsOverRows) {
  const int rows = 300, cols = 45;
  const std::vector<float> dy = RandomFloats(rows * cols, 12);
  float* dbias = Filled(cols, kNaN);
  kernels_->BiasGrad(Upload(dy), rows, cols, dbias);
  std::vector<double> expected(cols, 0.0);
  std::vector<double> magnitude(cols, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      expected[c] += dy[r * cols + c];
      magnitude[c] += std::abs(dy[r * cols + c]);
    }
  }
  EXPECT_TRUE(AllWithin(Download(dbias, cols), expected, ScaledTolerance(magnitude, 1e-5)));
}

TEST_P(KernelsConformanceTest, BiasGradOfNoRowsIsZero) {
  const int cols = 5;
  float* dbias = Filled(cols, kNaN);
  kernels_->BiasGrad(Filled(1, 1.0f), 0, cols, dbias);
  EXPECT_TRUE(AllNear(Download(dbias, cols), std::vector<double>(cols, 0.0)));
}

TEST_P(KernelsConformanceTest, ActivationForward) {
  const std::vector<float> x = ActivationInputs();
  const int64_t n = x.size();
  for (Activation f : kAllActivations) {
    SCOPED_TRACE(ActivationName(f));
    std::vector<double> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = ReferenceActivation(f, x[i]);

    float* y = Filled(n, kNaN);
    kernels_->ActivationForward(f, Upload(x), n, y);
    EXPECT_TRUE(AllNear(Download(y, n), expected));

    float* in_place = Upload(x);
    kernels_->ActivationForward(f, in_place, n, in_place);
    EXPECT_TRUE(AllNear(Download(in_place, n), expected)) << "in place";
  }
}

TEST_P(KernelsConformanceTest, ActivationBackward) {
  const std::vector<float> x = ActivationInputs();
  const int64_t n = x.size();
  const std::vector<float> dy = RandomFloats(n, 13, -2.0f, 2.0f);
  for (Activation f : kAllActivations) {
    SCOPED_TRACE(ActivationName(f));
    std::vector<float> y(n);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(ReferenceActivation(f, x[i]));
    std::vector<double> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = dy[i] * ReferenceDerivativeFromOutput(f, y[i]);

    float* y_device = Upload(y);
    float* dx = Filled(n, kNaN);
    kernels_->ActivationBackward(f, y_device, Upload(dy), n, dx);
    EXPECT_TRUE(AllNear(Download(dx, n), expected));

    float* in_place = Upload(dy);
    kernels_->ActivationBackward(f, y_device, in_place, n, in_place);
    EXPECT_TRUE(AllNear(Download(in_place, n), expected)) << "in place";
  }
}

struct SoftmaxReference {
  std::vector<double> loss;
  std::vector<double> dlogits;
};

SoftmaxReference ReferenceSoftmaxCrossEntropy(const std::vector<float>& logits,
                                              const std::vector<int32_t>& labels, int rows,
                                              int classes) {
  SoftmaxReference ref;
  ref.loss.resize(rows);
  ref.dlogits.resize(static_cast<size_t>(rows) * classes);
  for (int r = 0; r < rows; ++r) {
    const float* x = &logits[r * classes];
    const double max = *std::max_element(x, x + classes);
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(x[c] - max);
    const double log_sum_exp = max + std::log(sum);
    ref.loss[r] = log_sum_exp - x[labels[r]];
    for (int c = 0; c < classes; ++c) {
      const double p = std::exp(x[c] - log_sum_exp);
      ref.dlogits[r * classes + c] = (p - (c == labels[r] ? 1.0 : 0.0)) / rows;
    }
  }
  return ref;
}

TEST_P(KernelsConformanceTest, SoftmaxCrossEntropy) {
  struct Case {
    std::string name;
    int classes;
    std::vector<float> logits;
    std::vector<int32_t> labels;
  };
  std::vector<Case> cases;
  cases.push_back(Case{"random", 11, RandomFloats(6 * 11, 14, -5.0f, 5.0f), {0, 3, 10, 5, 5, 7}});
  // Huge logits: exp(1000) overflows a float unless the row's max is subtracted first.
  // clang-format off
  cases.push_back(Case{"huge", 5,
                       {1000, 0, -1000, 3, 999,             // the label is the max
                        1000, 0, -1000, 3, 999,             // the label is 2000 below it
                        -1000, -1000, -1000, -1000, -1000,  // all equal and very negative
                        1000, 1000, 1000, 1000, 1000},
                       {0, 2, 3, 1}});
  // clang-format on
  // More classes than one block of threads covers in one pass.
  cases.push_back(
      Case{"many_classes", 1000, RandomFloats(3 * 1000, 15, -10.0f, 10.0f), {0, 999, 500}});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int rows = c.labels.size();
    float* loss = Filled(rows, kNaN);
    float* dlogits = Filled(rows * c.classes, kNaN);
    kernels_->SoftmaxCrossEntropy(Upload(c.logits), UploadInts(c.labels), rows, c.classes, loss,
                                  dlogits);
    const SoftmaxReference ref = ReferenceSoftmaxCrossEntropy(c.logits, c.labels, rows, c.classes);
    EXPECT_TRUE(AllNear(Download(loss, rows), ref.loss)) << "loss";
    EXPECT_TRUE(AllNear(Download(dlogits, rows * c.classes), ref.dlogits)) << "dlogits";
  }
}

TEST_P(KernelsConformanceTest, ArgMax) {
  const int rows = 20, classes = 13;
  std::vector<float> logits = RandomFloats(rows * classes, 16);
  // Ties go to the first of the equal maxima.
  const std::vector<float> tie = {1, 5, 5, 2, 5, 0, 0, 0, 0, 0, 0, 0, 0};
  std::copy(tie.begin(), tie.end(), logits.begin() + 3 * classes);
  std::vector<int32_t> expected(rows);
  for (int r = 0; r < rows; ++r) {
    int best = 0;
    for (int c = 1; c < classes; ++c) {
      if (logits[r * classes + c] > logits[r * classes + best]) best = c;
    }
    expected[r] = best;
  }
  ASSERT_EQ(expected[3], 1);
  int32_t* out = UploadInts(std::vector<int32_t>(rows, -1));
  kernels_->ArgMax(Upload(logits), rows, classes, out);
  EXPECT_EQ(DownloadInts(out, rows), expected);
}

TEST_P(KernelsConformanceTest, ArgMaxOverManyClasses) {
  const int classes = 1000;
  std::vector<float> logits = RandomFloats(3 * classes, 17);
  logits[0 * classes + 777] = 5.0f;
  logits[1 * classes + 900] = 5.0f;  // a tie, settled by the lower index
  logits[1 * classes + 260] = 5.0f;
  logits[2 * classes + 999] = 5.0f;
  int32_t* out = UploadInts(std::vector<int32_t>(3, -1));
  kernels_->ArgMax(Upload(logits), 3, classes, out);
  EXPECT_EQ(DownloadInts(out, 3), (std::vector<int32_t>{777, 260, 999}));
}

TEST_P(KernelsConformanceTest, SigmoidCrossEntropy) {
  std::vector<float> logits;
  std::vector<float> labels;
  for (float z :
       {-100.0f, -50.0f, -20.0f, -1.0f, -1e-4f, 0.0f, 1e-4f, 1.0f, 3.5f, 20.0f, 50.0f, 100.0f}) {
    for (float y : {0.0f, 1.0f}) {
      logits.push_back(z);
      labels.push_back(y);
    }
  }
  const int rows = logits.size();
  std::vector<double> expected_loss(rows);
  std::vector<double> expected_dlogits(rows);
  for (int r = 0; r < rows; ++r) {
    const double z = logits[r];
    const double y = labels[r];
    expected_loss[r] = std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::abs(z)));
    expected_dlogits[r] = (1.0 / (1.0 + std::exp(-z)) - y) / rows;
  }
  float* loss = Filled(rows, kNaN);
  float* dlogits = Filled(rows, kNaN);
  kernels_->SigmoidCrossEntropy(Upload(logits), Upload(labels), rows, loss, dlogits);
  EXPECT_TRUE(AllNear(Download(loss, rows), expected_loss)) << "loss";
  EXPECT_TRUE(AllNear(Download(dlogits, rows), expected_dlogits)) << "dlogits";
}

// Bags of ids into a small table, placed at columns [out_col, out_col + dim) of a wider row.
struct Bags {
  int num_rows = 0;
  int dim = 0;
  std::vector<int32_t> row_index;
  std::vector<int32_t> offsets;
  int batch() const { return static_cast<int>(offsets.size()) - 1; }
};

// Bag 0 has two ids, bag 1 none, bag 2 the same row twice, bag 3 one id.
Bags SmallBags() { return Bags{5, 3, {1, 3, 0, 0, 4, 2}, {0, 2, 2, 5, 6}}; }

// Random bags of 0 to 6 ids (repeats likely) over a table wider than a warp.
Bags RandomBags() {
  Bags bags{40, 100, {}, {0}};
  std::mt19937 rng(18);
  std::uniform_int_distribution<int> size(0, 6);
  std::uniform_int_distribution<int> id(0, bags.num_rows - 1);
  for (int b = 0; b < 50; ++b) {
    const int n = size(rng);
    for (int i = 0; i < n; ++i) bags.row_index.push_back(id(rng));
    bags.offsets.push_back(bags.row_index.size());
  }
  return bags;
}

TEST_P(KernelsConformanceTest, EmbeddingBagForward) {
  for (const Bags& bags : {SmallBags(), RandomBags()}) {
    for (bool mean : {false, true}) {
      SCOPED_TRACE(absl::StrCat("dim=", bags.dim, " mean=", mean));
      const int batch = bags.batch();
      const int out_col = 4;
      const int out_stride = bags.dim + 7;
      const float untouched = 7.0f;
      const std::vector<float> rows = RandomFloats(bags.num_rows * bags.dim, 19);
      std::vector<double> expected(batch * out_stride, untouched);
      for (int b = 0; b < batch; ++b) {
        const int count = bags.offsets[b + 1] - bags.offsets[b];
        for (int d = 0; d < bags.dim; ++d) {
          double sum = 0;
          for (int i = bags.offsets[b]; i < bags.offsets[b + 1]; ++i) {
            sum += rows[bags.row_index[i] * bags.dim + d];
          }
          expected[b * out_stride + out_col + d] = mean && count > 0 ? sum / count : sum;
        }
      }
      float* out = Filled(batch * out_stride, untouched);
      kernels_->EmbeddingBagForward(Upload(rows), UploadInts(bags.row_index),
                                    UploadInts(bags.offsets), batch, bags.dim, mean, out_stride,
                                    out_col, out);
      EXPECT_TRUE(AllNear(Download(out, batch * out_stride), expected));
    }
  }
}

TEST_P(KernelsConformanceTest, EmbeddingBagBackward) {
  for (const Bags& bags : {SmallBags(), RandomBags()}) {
    for (bool mean : {false, true}) {
      SCOPED_TRACE(absl::StrCat("dim=", bags.dim, " mean=", mean));
      const int batch = bags.batch();
      const int out_col = 2;
      const int out_stride = bags.dim + 5;
      const std::vector<float> dout = RandomFloats(batch * out_stride, 20);
      // Gradients add to what drows holds.
      const float initial = 0.25f;
      std::vector<double> expected(bags.num_rows * bags.dim, initial);
      for (int b = 0; b < batch; ++b) {
        const int count = bags.offsets[b + 1] - bags.offsets[b];
        const double scale = mean && count > 0 ? 1.0 / count : 1.0;
        for (int i = bags.offsets[b]; i < bags.offsets[b + 1]; ++i) {
          for (int d = 0; d < bags.dim; ++d) {
            expected[bags.row_index[i] * bags.dim + d] +=
                dout[b * out_stride + out_col + d] * scale;
          }
        }
      }
      float* drows = Filled(bags.num_rows * bags.dim, initial);
      kernels_->EmbeddingBagBackward(Upload(dout), UploadInts(bags.row_index),
                                     UploadInts(bags.offsets), batch, bags.dim, mean, out_stride,
                                     out_col, drows);
      EXPECT_TRUE(AllNear(Download(drows, bags.num_rows * bags.dim), expected));
    }
  }
}

TEST_P(KernelsConformanceTest, Axpy) {
  const int n = 1000;
  const std::vector<float> x = RandomFloats(n, 21);
  const std::vector<float> y0 = RandomFloats(n, 22);
  float* y = Upload(y0);
  kernels_->Axpy(n, -0.5f, Upload(x), y);
  std::vector<double> expected(n);
  for (int i = 0; i < n; ++i) expected[i] = y0[i] - 0.5 * x[i];
  EXPECT_TRUE(AllNear(Download(y, n), expected));
}

TEST_P(KernelsConformanceTest, Fill) {
  const int n = 1000;
  float* x = Filled(n, kNaN);
  kernels_->Fill(x, n, 3.5f);
  EXPECT_EQ(Download(x, n), std::vector<float>(n, 3.5f));
}

TEST_P(KernelsConformanceTest, CopiesRoundTrip) {
  const std::vector<float> floats = RandomFloats(77, 23);
  EXPECT_EQ(Download(Upload(floats), floats.size()), floats);
  const std::vector<int32_t> ints = {0, -1, 7, std::numeric_limits<int32_t>::max(),
                                     std::numeric_limits<int32_t>::min()};
  EXPECT_EQ(DownloadInts(UploadInts(ints), ints.size()), ints);
}

TEST_P(KernelsConformanceTest, AllocationsAreDistinctEvenWhenEmpty) {
  absl::StatusOr<float*> a = kernels_->AllocateFloats(0);
  absl::StatusOr<int32_t*> b = kernels_->AllocateInts(0);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*a, nullptr);
  EXPECT_NE(static_cast<void*>(*a), static_cast<void*>(*b));
  kernels_->Free(*a);
  kernels_->Free(*b);
  kernels_->Free(nullptr);
}

TEST_P(KernelsConformanceTest, NegativeAllocationIsInvalidArgument) {
  absl::StatusOr<float*> floats = kernels_->AllocateFloats(-1);
  EXPECT_EQ(floats.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(floats.status().message().find("-1"), std::string::npos) << floats.status();
  absl::StatusOr<int32_t*> ints = kernels_->AllocateInts(-2);
  EXPECT_EQ(ints.status().code(), absl::StatusCode::kInvalidArgument);
}

// Zero rows, columns or elements launch nothing and touch nothing.
TEST_P(KernelsConformanceTest, EmptyShapesAreNoOps) {
  const float sentinel = 9.0f;
  float* x = Filled(4, sentinel);
  int32_t* ints = UploadInts({5, 5, 5, 5});
  const std::vector<int32_t> zero_offsets = {0};
  kernels_->Gemm(false, false, 0, 2, 2, 1.0f, x, x, 0.0f, x);
  kernels_->Gemm(false, false, 2, 0, 2, 1.0f, x, x, 0.0f, x);
  kernels_->AddBias(x, 0, 2, x);
  kernels_->ActivationForward(Activation::kSigmoid, x, 0, x);
  kernels_->ActivationBackward(Activation::kTanh, x, x, 0, x);
  kernels_->SoftmaxCrossEntropy(x, ints, 0, 3, x, x);
  kernels_->ArgMax(x, 0, 3, ints);
  kernels_->SigmoidCrossEntropy(x, x, 0, x, x);
  kernels_->EmbeddingBagForward(x, ints, UploadInts(zero_offsets), 0, 2, true, 2, 0, x);
  kernels_->EmbeddingBagBackward(x, ints, UploadInts(zero_offsets), 0, 2, true, 2, 0, x);
  kernels_->Axpy(0, 1.0f, x, x);
  kernels_->Fill(x, 0, 1.0f);
  EXPECT_EQ(Download(x, 4), std::vector<float>(4, sentinel));
  EXPECT_EQ(DownloadInts(ints, 4), (std::vector<int32_t>{5, 5, 5, 5}));
}

TEST_P(KernelsConformanceTest, ScaleMultipliesInPlace) {
  float* x = Upload({1.0f, -2.0f, 0.5f, 8.0f});
  kernels_->Scale(4, 0.25f, x);
  kernels_->Scale(0, 100.0f, x);
  EXPECT_EQ(Download(x, 4), (std::vector<float>{0.25f, -0.5f, 0.125f, 2.0f}));
}

// Uploads and downloads on the copy streams, ordered with the compute stream by events, from
// and into host memory of AllocateHost.
TEST_P(KernelsConformanceTest, AsyncCopiesOrderedByEvents) {
  constexpr int64_t n = 1 << 16;
  absl::StatusOr<void*> in = kernels_->AllocateHost(n * 4);
  absl::StatusOr<void*> out = kernels_->AllocateHost(n * 4);
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_TRUE(out.ok()) << out.status();
  float* host_in = static_cast<float*>(*in);
  float* host_out = static_cast<float*>(*out);
  for (int64_t i = 0; i < n; ++i) host_in[i] = static_cast<float>(i % 1000) * 0.5f;
  float* device = Filled(n, -1.0f);
  Download(device, 1);  // the fill is done: only the copies below touch the buffer
  std::unique_ptr<Kernels::Event> uploaded = kernels_->NewEvent();
  std::unique_ptr<Kernels::Event> computed = kernels_->NewEvent();
  std::unique_ptr<Kernels::Event> downloaded = kernels_->NewEvent();
  kernels_->Synchronize(uploaded.get());  // never recorded: complete
  kernels_->CopyToDeviceAsync(Kernels::Stream::kUpload, host_in, device, n * 4);
  kernels_->Record(uploaded.get(), Kernels::Stream::kUpload);
  kernels_->Wait(Kernels::Stream::kCompute, uploaded.get());
  kernels_->Scale(n, 2.0f, device);
  kernels_->Record(computed.get(), Kernels::Stream::kCompute);
  kernels_->Wait(Kernels::Stream::kDownload, computed.get());
  kernels_->CopyToHostAsync(Kernels::Stream::kDownload, device, host_out, n * 4);
  kernels_->Record(downloaded.get(), Kernels::Stream::kDownload);
  kernels_->Synchronize(downloaded.get());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(host_out[i], static_cast<float>(i % 1000)) << i;
  }
  kernels_->FreeHost(host_in);
  kernels_->FreeHost(host_out);
}

// Rows of a narrow host matrix into the first columns of a wider device one.
TEST_P(KernelsConformanceTest, CopyRowsToDeviceFillsTheLeadingColumns) {
  const std::vector<float> host = {1, 2, 3, 4, 5, 6};  // 3 rows of 2
  float* device = Filled(3 * 4, 0.0f);                 // 3 rows of 4
  Download(device, 1);
  kernels_->CopyRowsToDeviceAsync(Kernels::Stream::kUpload, host.data(), 2 * 4, device, 4 * 4,
                                  2 * 4, 3);
  std::unique_ptr<Kernels::Event> done = kernels_->NewEvent();
  kernels_->Record(done.get(), Kernels::Stream::kUpload);
  kernels_->Synchronize(done.get());
  EXPECT_EQ(Download(device, 12), (std::vector<float>{1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0, 0}));
}

}  // namespace
}  // namespace pscluster
