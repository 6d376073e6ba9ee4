// The conformance tests of every Kernels backend. Each expected value comes from a plain
// double-precision loop written here, never from a backend's own code.

#include "kernels/kernels_test_body.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
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

// A graph replays the compute it recorded on its buffers as they are when it is launched, and
// nothing ran while it was recorded. A backend that cannot capture says so.
TEST_P(KernelsConformanceTest, CapturedWorkReplaysOnTheBuffersAsTheyAreAtLaunch) {
  if (!kernels_->can_capture()) {
    EXPECT_EQ(kernels_->BeginCapture().code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(kernels_->EndCapture().status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  const int m = 33, k = 40, n = 17;
  float* x = Upload(RandomFloats(m * k, 20));
  float* w = Upload(RandomFloats(k * n, 21));
  float* bias = Upload(RandomFloats(n, 22));
  float* y = Filled(m * n, -7.0f);
  auto layer = [&](float* out) {
    kernels_->Gemm(false, false, m, n, k, 1.0f, x, w, 0.0f, out);
    kernels_->AddBias(bias, m, n, out);
    kernels_->ActivationForward(Activation::kRelu, out, int64_t{m} * n, out);
  };
  ASSERT_TRUE(kernels_->BeginCapture().ok());
  layer(y);
  absl::StatusOr<std::unique_ptr<Kernels::Graph>> graph = kernels_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(Download(y, m * n), std::vector<float>(m * n, -7.0f));
  float* expected = Filled(m * n, 0.0f);
  for (int round = 0; round < 3; ++round) {
    const std::vector<float> x_now = RandomFloats(m * k, 30 + round);
    kernels_->CopyToDevice(x_now.data(), x, int64_t{m} * k);
    kernels_->Launch(graph->get());
    layer(expected);
    // The same kernels on the same inputs: the same bits.
    EXPECT_EQ(Download(y, m * n), Download(expected, m * n)) << "round " << round;
  }
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

// Rows of floats and of int32 words, in any order and repeated, copied bit for bit.
TEST_P(KernelsConformanceTest, GatherRows) {
  const int rows = 50, row = 7;
  const std::vector<float> table = RandomFloats(rows * row, 30);
  const std::vector<int32_t> index = {49, 0, 3, 3, 17, 48};
  const int n = static_cast<int>(index.size());
  float* out = Filled(n * row, kNaN);
  kernels_->GatherRows(Upload(table), UploadInts(index), n, row, out);
  std::vector<float> expected;
  for (int32_t r : index) {
    expected.insert(expected.end(), table.begin() + r * row, table.begin() + (r + 1) * row);
  }
  EXPECT_EQ(Download(out, n * row), expected);
  std::vector<int32_t> labels(rows);
  for (int i = 0; i < rows; ++i) labels[i] = i * 3 - 70;
  int32_t* got = UploadInts(std::vector<int32_t>(n, 0));
  kernels_->GatherRows(UploadInts(labels), UploadInts(index), n, 1, got);
  std::vector<int32_t> want;
  for (int32_t r : index) want.push_back(labels[r]);
  EXPECT_EQ(DownloadInts(got, n), want);
}

// Two updates of each kind against the formulas of kernels.h, in double.
TEST_P(KernelsConformanceTest, ApplyUpdate) {
  using Kind = ElementwiseUpdate::Kind;
  const int n = 1000;
  for (Kind kind : {Kind::kSgd, Kind::kMomentum, Kind::kAdam, Kind::kMovingAverage}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && kind != Kind::kMomentum) continue;
      SCOPED_TRACE(absl::StrCat("kind=", static_cast<int>(kind), " nesterov=", nesterov));
      ElementwiseUpdate u;
      u.kind = kind;
      u.lr = 0.01f;
      u.beta1 = 0.9f;
      u.beta2 = 0.999f;
      u.epsilon = 1e-7f;
      u.momentum = 0.9f;
      u.nesterov = nesterov;
      const std::vector<float> var0 = RandomFloats(n, 23);
      std::vector<double> var(var0.begin(), var0.end()), s0(n, 0.0), s1(n, 0.0);
      float* d_var = Upload(var0);
      float* d_s0 = Filled(n, 0.0f);
      float* d_s1 = Filled(n, 0.0f);
      for (int step = 0; step < 2; ++step) {
        const std::vector<float> g = RandomFloats(n, 24 + step);
        kernels_->ApplyUpdate(u, n, Upload(g), d_var, d_s0, d_s1);
        for (int i = 0; i < n; ++i) {
          switch (kind) {
            case Kind::kSgd:
              var[i] -= u.lr * g[i];
              break;
            case Kind::kMomentum:
              s0[i] = u.momentum * s0[i] + g[i];
              var[i] -= nesterov ? u.lr * g[i] + u.lr * u.momentum * s0[i] : u.lr * s0[i];
              break;
            case Kind::kAdam:
              s0[i] += (1 - u.beta1) * (g[i] - s0[i]);
              s1[i] += (1 - u.beta2) * (double{g[i]} * g[i] - s1[i]);
              var[i] -= u.lr * s0[i] / (std::sqrt(s1[i]) + u.epsilon);
              break;
            case Kind::kMovingAverage:
              var[i] -= (1 - u.momentum) * (var[i] - g[i]);
              break;
          }
        }
      }
      EXPECT_TRUE(AllNear(Download(d_var, n), var));
      if (kind == Kind::kMomentum || kind == Kind::kAdam) {
        EXPECT_TRUE(AllNear(Download(d_s0, n), s0));
      }
      if (kind == Kind::kAdam) EXPECT_TRUE(AllNear(Download(d_s1, n), s1));
    }
  }
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
  kernels_->ScaleCopy(0, 2.0f, x, x);
  kernels_->Add(0, x, x, x);
  kernels_->GlobalAvgPoolForward(x, 0, 2, 2, x);
  kernels_->GlobalAvgPoolBackward(x, 0, 2, 2, x);
  kernels_->BatchNormForwardInference(x, 0, 2, x, x, x, x, 1e-3f, x);
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

// ---- Convolutional layers ----

// ScaleCopy with alpha 1 is a copy; other alphas scale; x and y may alias.
TEST_P(KernelsConformanceTest, ScaleCopy) {
  const int n = 1000;
  const std::vector<float> x0 = RandomFloats(n, 30);
  float* x = Upload(x0);
  float* y = Filled(n, kNaN);
  kernels_->ScaleCopy(n, 1.0f, x, y);
  EXPECT_EQ(Download(y, n), x0);
  kernels_->ScaleCopy(n, -0.75f, x, y);
  std::vector<double> expected(n);
  for (int i = 0; i < n; ++i) expected[i] = -0.75 * x0[i];
  EXPECT_TRUE(AllNear(Download(y, n), expected));
  // In place.
  kernels_->ScaleCopy(n, -0.75f, x, x);
  EXPECT_TRUE(AllNear(Download(x, n), expected));
  kernels_->ScaleCopy(n, 1.0f, x, x);
  EXPECT_TRUE(AllNear(Download(x, n), expected));
}

TEST_P(KernelsConformanceTest, AddWithAndWithoutAliasing) {
  const int n = 1001;
  const std::vector<float> a0 = RandomFloats(n, 31);
  const std::vector<float> b0 = RandomFloats(n, 32);
  std::vector<double> expected(n);
  for (int i = 0; i < n; ++i) expected[i] = double{a0[i]} + b0[i];
  float* a = Upload(a0);
  float* b = Upload(b0);
  float* out = Filled(n, kNaN);
  kernels_->Add(n, a, b, out);
  EXPECT_TRUE(AllNear(Download(out, n), expected));
  kernels_->Add(n, a, b, a);  // out == a
  EXPECT_TRUE(AllNear(Download(a, n), expected));
  float* a2 = Upload(a0);
  kernels_->Add(n, a2, b, b);  // out == b
  EXPECT_TRUE(AllNear(Download(b, n), expected));
  float* c = Upload(a0);
  kernels_->Add(n, c, c, c);  // out == a == b
  std::vector<double> doubled(n);
  for (int i = 0; i < n; ++i) doubled[i] = 2.0 * a0[i];
  EXPECT_TRUE(AllNear(Download(c, n), doubled));
}

// A window geometry by TensorFlow's rules, as kernels.h states them.
ConvGeometry MakeGeometry(int batch, int height, int width, int channels, int kernel_h,
                          int kernel_w, int stride_h, int stride_w, bool same) {
  ConvGeometry g;
  g.batch = batch;
  g.height = height;
  g.width = width;
  g.channels = channels;
  g.kernel_h = kernel_h;
  g.kernel_w = kernel_w;
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  if (same) {
    g.out_h = (height + stride_h - 1) / stride_h;
    g.out_w = (width + stride_w - 1) / stride_w;
    g.pad_top = std::max((g.out_h - 1) * stride_h + kernel_h - height, 0) / 2;
    g.pad_left = std::max((g.out_w - 1) * stride_w + kernel_w - width, 0) / 2;
  } else {
    g.out_h = (height - kernel_h) / stride_h + 1;
    g.out_w = (width - kernel_w) / stride_w + 1;
  }
  return g;
}

std::string GeometryName(const ConvGeometry& g) {
  return absl::StrCat("batch ", g.batch, " in ", g.height, "x", g.width, "x", g.channels,
                      " kernel ", g.kernel_h, "x", g.kernel_w, " stride ", g.stride_h, "x",
                      g.stride_w, " pad ", g.pad_top, ",", g.pad_left, " out ", g.out_h, "x",
                      g.out_w);
}

// SAME and VALID, strides 1 and 2, kernels 1x1, 3x3 and a non-square one, odd and even sizes;
// channels that are not a multiple of 4 and (the GPU's four-at-a-time path) ones that are.
std::vector<ConvGeometry> ConvGeometries() {
  std::vector<ConvGeometry> geometries;
  for (bool same : {true, false}) {
    for (int kernel : {1, 3}) {
      for (int stride : {1, 2}) {
        geometries.push_back(MakeGeometry(2, 7, 5, 3, kernel, kernel, stride, stride, same));
      }
    }
    geometries.push_back(MakeGeometry(3, 8, 6, 3, 3, 3, 2, 2, same));
    geometries.push_back(MakeGeometry(1, 6, 9, 4, 2, 3, 1, 2, same));
    geometries.push_back(MakeGeometry(2, 7, 6, 8, 3, 3, 1, 1, same));
    geometries.push_back(MakeGeometry(2, 6, 7, 16, 3, 3, 2, 2, same));
  }
  return geometries;
}

// x[n, h, w, c] for an (ih, iw) that may lie in the padding (then 0).
double PaddedInput(const ConvGeometry& g, const std::vector<float>& x, int n, int ih, int iw,
                   int c) {
  if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) return 0.0;
  return x[((static_cast<int64_t>(n) * g.height + ih) * g.width + iw) * g.channels + c];
}

std::vector<double> ReferenceIm2Col(const ConvGeometry& g, const std::vector<float>& x) {
  std::vector<double> cols;
  for (int n = 0; n < g.batch; ++n) {
    for (int oh = 0; oh < g.out_h; ++oh) {
      for (int ow = 0; ow < g.out_w; ++ow) {
        for (int kh = 0; kh < g.kernel_h; ++kh) {
          for (int kw = 0; kw < g.kernel_w; ++kw) {
            for (int c = 0; c < g.channels; ++c) {
              cols.push_back(PaddedInput(g, x, n, oh * g.stride_h - g.pad_top + kh,
                                         ow * g.stride_w - g.pad_left + kw, c));
            }
          }
        }
      }
    }
  }
  return cols;
}

TEST_P(KernelsConformanceTest, Im2ColCopiesPatches) {
  uint32_t seed = 40;
  for (const ConvGeometry& g : ConvGeometries()) {
    SCOPED_TRACE(GeometryName(g));
    const std::vector<float> x = RandomFloats(g.input_size(), ++seed);
    const int64_t n = g.output_positions() * g.patch_size();
    float* cols = Filled(n, kNaN);
    kernels_->Im2Col(g, Upload(x), cols);
    // A copy: exact.
    EXPECT_TRUE(AllNear(Download(cols, n), ReferenceIm2Col(g, x), 0.0, 0.0));
  }
}

TEST_P(KernelsConformanceTest, Col2ImSumsWhatIm2ColRead) {
  uint32_t seed = 60;
  for (const ConvGeometry& g : ConvGeometries()) {
    SCOPED_TRACE(GeometryName(g));
    const int64_t n = g.output_positions() * g.patch_size();
    const std::vector<float> dcols = RandomFloats(n, ++seed);
    std::vector<double> expected(g.input_size(), 0.0);
    std::vector<double> magnitude(g.input_size(), 0.0);
    int64_t i = 0;
    for (int b = 0; b < g.batch; ++b) {
      for (int oh = 0; oh < g.out_h; ++oh) {
        for (int ow = 0; ow < g.out_w; ++ow) {
          for (int kh = 0; kh < g.kernel_h; ++kh) {
            for (int kw = 0; kw < g.kernel_w; ++kw) {
              for (int c = 0; c < g.channels; ++c, ++i) {
                const int ih = oh * g.stride_h - g.pad_top + kh;
                const int iw = ow * g.stride_w - g.pad_left + kw;
                if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                const int64_t at = ((int64_t{b} * g.height + ih) * g.width + iw) * g.channels + c;
                expected[at] += dcols[i];
                magnitude[at] += std::abs(dcols[i]);
              }
            }
          }
        }
      }
    }
    float* dx = Filled(g.input_size(), kNaN);  // overwritten, not accumulated
    kernels_->Col2Im(g, Upload(dcols), dx);
    EXPECT_TRUE(
        AllWithin(Download(dx, g.input_size()), expected, ScaledTolerance(magnitude, 1e-6)));
  }
}

// <Im2Col(x), d> == <x, Col2Im(d)>, both computed in double from the backend's outputs.
TEST_P(KernelsConformanceTest, Col2ImIsTheAdjointOfIm2Col) {
  uint32_t seed = 80;
  for (const ConvGeometry& g : ConvGeometries()) {
    SCOPED_TRACE(GeometryName(g));
    const int64_t n = g.output_positions() * g.patch_size();
    const std::vector<float> x = RandomFloats(g.input_size(), ++seed);
    const std::vector<float> d = RandomFloats(n, ++seed);
    float* cols = Filled(n, kNaN);
    float* dx = Filled(g.input_size(), kNaN);
    kernels_->Im2Col(g, Upload(x), cols);
    kernels_->Col2Im(g, Upload(d), dx);
    const std::vector<float> cols_host = Download(cols, n);
    const std::vector<float> dx_host = Download(dx, g.input_size());
    double lhs = 0, rhs = 0, magnitude = 0;
    for (int64_t i = 0; i < n; ++i) {
      lhs += double{cols_host[i]} * d[i];
      magnitude += std::abs(double{cols_host[i]} * d[i]);
    }
    for (int64_t i = 0; i < g.input_size(); ++i) rhs += double{x[i]} * dx_host[i];
    EXPECT_NEAR(lhs, rhs, 1e-6 * magnitude + 1e-9);
  }
}

struct PoolReference {
  std::vector<double> y;
  std::vector<int32_t> argmax;
};

PoolReference ReferenceMaxPool(const ConvGeometry& g, const std::vector<float>& x) {
  PoolReference ref;
  for (int n = 0; n < g.batch; ++n) {
    for (int oh = 0; oh < g.out_h; ++oh) {
      for (int ow = 0; ow < g.out_w; ++ow) {
        for (int c = 0; c < g.channels; ++c) {
          double best = -std::numeric_limits<double>::infinity();
          int32_t best_index = -1;
          for (int kh = 0; kh < g.kernel_h; ++kh) {
            for (int kw = 0; kw < g.kernel_w; ++kw) {
              const int ih = oh * g.stride_h - g.pad_top + kh;
              const int iw = ow * g.stride_w - g.pad_left + kw;
              if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
              const int32_t i = ((n * g.height + ih) * g.width + iw) * g.channels + c;
              if (best_index < 0 || x[i] > best) {
                best = x[i];
                best_index = i;
              }
            }
          }
          ref.y.push_back(best);
          ref.argmax.push_back(best_index);
        }
      }
    }
  }
  return ref;
}

std::vector<ConvGeometry> PoolGeometries() {
  std::vector<ConvGeometry> geometries;
  for (bool same : {true, false}) {
    geometries.push_back(MakeGeometry(2, 7, 5, 3, 3, 3, 2, 2, same));  // overlapping windows
    geometries.push_back(MakeGeometry(2, 7, 5, 3, 3, 3, 1, 1, same));
    geometries.push_back(MakeGeometry(2, 8, 6, 3, 2, 2, 2, 2, same));
    geometries.push_back(MakeGeometry(1, 9, 7, 3, 3, 2, 2, 1, same));
  }
  return geometries;
}

TEST_P(KernelsConformanceTest, MaxPoolForward) {
  uint32_t seed = 100;
  for (const ConvGeometry& g : PoolGeometries()) {
    // Random values; negative ones only (padding must never win); few distinct values, so
    // that ties go to the first position.
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(absl::StrCat(GeometryName(g), " variant ", variant));
      std::vector<float> x = RandomFloats(g.input_size(), ++seed, variant == 1 ? -3.0f : -1.0f,
                                          variant == 1 ? -1.0f : 1.0f);
      if (variant == 2) {
        for (float& v : x) v = std::round(v);
      }
      const int64_t n = g.output_positions() * g.channels;
      float* y = Filled(n, kNaN);
      int32_t* argmax = UploadInts(std::vector<int32_t>(n, -7));
      kernels_->MaxPoolForward(g, Upload(x), y, argmax);
      const PoolReference ref = ReferenceMaxPool(g, x);
      EXPECT_TRUE(AllNear(Download(y, n), ref.y, 0.0, 0.0));
      EXPECT_EQ(DownloadInts(argmax, n), ref.argmax);
    }
  }
}

TEST_P(KernelsConformanceTest, MaxPoolBackwardRoutesToTheArgmax) {
  uint32_t seed = 130;
  for (const ConvGeometry& g : PoolGeometries()) {
    for (bool ties : {false, true}) {
      SCOPED_TRACE(absl::StrCat(GeometryName(g), ties ? " with ties" : ""));
      std::vector<float> x = RandomFloats(g.input_size(), ++seed);
      if (ties) {
        for (float& v : x) v = std::round(v);
      }
      const PoolReference ref = ReferenceMaxPool(g, x);
      const int64_t n = g.output_positions() * g.channels;
      const std::vector<float> dy = RandomFloats(n, ++seed);
      std::vector<double> expected(g.input_size(), 0.0);
      std::vector<double> magnitude(g.input_size(), 0.0);
      for (int64_t o = 0; o < n; ++o) {
        expected[ref.argmax[o]] += dy[o];
        magnitude[ref.argmax[o]] += std::abs(dy[o]);
      }
      float* dx = Filled(g.input_size(), kNaN);  // overwritten
      kernels_->MaxPoolBackward(g, Upload(dy), UploadInts(ref.argmax), dx);
      EXPECT_TRUE(
          AllWithin(Download(dx, g.input_size()), expected, ScaledTolerance(magnitude, 1e-6)));
    }
  }
}

// Average pooling against a double reference written from the definition: each window's
// positions inside the input, the mean over them; backward, the adjoint (each window's
// gradient spread evenly over its positions). SAME geometries have windows partly in the
// padding, which must not count.
TEST_P(KernelsConformanceTest, AvgPoolForwardAndBackward) {
  uint32_t seed = 160;
  for (const ConvGeometry& g : PoolGeometries()) {
    SCOPED_TRACE(GeometryName(g));
    const std::vector<float> x = RandomFloats(g.input_size(), ++seed);
    const int64_t n = g.output_positions() * g.channels;
    const std::vector<float> dy = RandomFloats(n, ++seed);
    std::vector<double> y(n, 0.0), dx(g.input_size(), 0.0), dx_magnitude(g.input_size(), 0.0);
    for (int b = 0; b < g.batch; ++b) {
      for (int oh = 0; oh < g.out_h; ++oh) {
        for (int ow = 0; ow < g.out_w; ++ow) {
          std::vector<int64_t> inside;  // flat indices of channel 0
          for (int kh = 0; kh < g.kernel_h; ++kh) {
            for (int kw = 0; kw < g.kernel_w; ++kw) {
              const int h = oh * g.stride_h - g.pad_top + kh;
              const int w = ow * g.stride_w - g.pad_left + kw;
              if (h < 0 || h >= g.height || w < 0 || w >= g.width) continue;
              inside.push_back(((int64_t{b} * g.height + h) * g.width + w) * g.channels);
            }
          }
          ASSERT_FALSE(inside.empty());
          for (int c = 0; c < g.channels; ++c) {
            const int64_t o = ((int64_t{b} * g.out_h + oh) * g.out_w + ow) * g.channels + c;
            for (int64_t i : inside) {
              y[o] += double{x[i + c]} / static_cast<double>(inside.size());
              dx[i + c] += double{dy[o]} / static_cast<double>(inside.size());
              dx_magnitude[i + c] += std::abs(dy[o]);
            }
          }
        }
      }
    }
    float* out = Filled(n, kNaN);  // overwritten
    kernels_->AvgPoolForward(g, Upload(x), out);
    EXPECT_TRUE(AllNear(Download(out, n), y));
    float* grad = Filled(g.input_size(), kNaN);  // overwritten
    kernels_->AvgPoolBackward(g, Upload(dy), grad);
    EXPECT_TRUE(AllWithin(Download(grad, g.input_size()), dx, ScaledTolerance(dx_magnitude, 1e-6)));
  }
}

TEST_P(KernelsConformanceTest, GlobalAvgPool) {
  const int batch = 3, positions = 35, channels = 5;
  const std::vector<float> x = RandomFloats(int64_t{batch} * positions * channels, 140);
  float* y = Filled(batch * channels, kNaN);
  kernels_->GlobalAvgPoolForward(Upload(x), batch, positions, channels, y);
  std::vector<double> expected(batch * channels, 0.0);
  for (int n = 0; n < batch; ++n) {
    for (int p = 0; p < positions; ++p) {
      for (int c = 0; c < channels; ++c) {
        expected[n * channels + c] += x[(n * positions + p) * channels + c] / double{positions};
      }
    }
  }
  EXPECT_TRUE(AllNear(Download(y, batch * channels), expected));

  const std::vector<float> dy = RandomFloats(batch * channels, 141);
  float* dx = Filled(int64_t{batch} * positions * channels, kNaN);
  kernels_->GlobalAvgPoolBackward(Upload(dy), batch, positions, channels, dx);
  std::vector<double> expected_dx(int64_t{batch} * positions * channels);
  for (int n = 0; n < batch; ++n) {
    for (int p = 0; p < positions; ++p) {
      for (int c = 0; c < channels; ++c) {
        expected_dx[(n * positions + p) * channels + c] = dy[n * channels + c] / double{positions};
      }
    }
  }
  EXPECT_TRUE(AllNear(Download(dx, int64_t{batch} * positions * channels), expected_dx));
}

// Columns with different offsets and spreads: a large offset punishes E[x^2] - E[x]^2.
std::vector<float> BatchNormInput(int64_t rows, int channels, uint32_t seed) {
  std::vector<float> x = RandomFloats(rows * channels, seed);
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < channels; ++c) {
      const float offset = (c % 4 == 0) ? 40.0f : static_cast<float>(c % 7) - 2.0f;
      const float spread = 0.25f + 0.5f * static_cast<float>(c % 3);
      x[r * channels + c] = offset + spread * x[r * channels + c];
    }
  }
  return x;
}

struct BatchNormStats {
  std::vector<double> mean;
  std::vector<double> variance;
};

BatchNormStats ReferenceBatchNormStats(const std::vector<float>& x, int64_t rows, int channels) {
  BatchNormStats s{std::vector<double>(channels, 0.0), std::vector<double>(channels, 0.0)};
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < channels; ++c) s.mean[c] += x[r * channels + c];
  }
  for (int c = 0; c < channels; ++c) s.mean[c] /= static_cast<double>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < channels; ++c) {
      const double d = x[r * channels + c] - s.mean[c];
      s.variance[c] += d * d;
    }
  }
  for (int c = 0; c < channels; ++c) s.variance[c] /= static_cast<double>(rows);
  return s;
}

// y = gamma * (x - mean) / sqrt(variance + epsilon) + beta in double.
template <typename Mean, typename Variance>
std::vector<double> ReferenceBatchNormApply(const std::vector<float>& x, int64_t rows, int channels,
                                            const std::vector<float>& gamma,
                                            const std::vector<float>& beta, const Mean& mean,
                                            const Variance& variance, double epsilon) {
  std::vector<double> y(rows * channels);
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < channels; ++c) {
      y[r * channels + c] = double{gamma[c]} * (x[r * channels + c] - double{mean[c]}) /
                                std::sqrt(double{variance[c]} + epsilon) +
                            beta[c];
    }
  }
  return y;
}

struct BatchNormShape {
  int64_t rows;
  int channels;
};

// Small, and large enough to spread a reduction over many blocks (on CUDA).
// More than 1024 channels takes CUDA's path without shared memory.
constexpr BatchNormShape kBatchNormShapes[] = {{5, 3},     {1, 4},     {70000, 16},
                                               {30011, 3}, {4099, 64}, {37, 1500}};

TEST_P(KernelsConformanceTest, BatchNormForwardTraining) {
  uint32_t seed = 150;
  for (const BatchNormShape& shape : kBatchNormShapes) {
    const int64_t rows = shape.rows;
    const int channels = shape.channels;
    SCOPED_TRACE(absl::StrCat("rows ", rows, " channels ", channels));
    const std::vector<float> x = BatchNormInput(rows, channels, ++seed);
    const std::vector<float> gamma = RandomFloats(channels, ++seed, 0.5f, 2.0f);
    const std::vector<float> beta = RandomFloats(channels, ++seed);
    const float epsilon = 1e-3f;
    float* y = Filled(rows * channels, kNaN);
    float* mean = Filled(channels, kNaN);
    float* variance = Filled(channels, kNaN);
    kernels_->BatchNormForwardTraining(Upload(x), rows, channels, Upload(gamma), Upload(beta),
                                       epsilon, y, mean, variance);
    const BatchNormStats ref = ReferenceBatchNormStats(x, rows, channels);
    std::vector<double> mean_tolerance(channels);
    for (int c = 0; c < channels; ++c) mean_tolerance[c] = 1e-6 + 2e-6 * std::abs(ref.mean[c]);
    EXPECT_TRUE(AllWithin(Download(mean, channels), ref.mean, mean_tolerance));
    EXPECT_TRUE(AllNear(Download(variance, channels), ref.variance, 1e-4, 1e-6));
    const std::vector<double> expected =
        ReferenceBatchNormApply(x, rows, channels, gamma, beta, ref.mean, ref.variance, epsilon);
    EXPECT_TRUE(AllNear(Download(y, rows * channels), expected, 1e-4, 1e-4));
  }
}

TEST_P(KernelsConformanceTest, BatchNormForwardInference) {
  uint32_t seed = 170;
  for (const BatchNormShape& shape :
       {BatchNormShape{5, 3}, BatchNormShape{70000, 16}, BatchNormShape{37, 1500}}) {
    const int64_t rows = shape.rows;
    const int channels = shape.channels;
    SCOPED_TRACE(absl::StrCat("rows ", rows, " channels ", channels));
    const std::vector<float> x = BatchNormInput(rows, channels, ++seed);
    const std::vector<float> gamma = RandomFloats(channels, ++seed, 0.5f, 2.0f);
    const std::vector<float> beta = RandomFloats(channels, ++seed);
    const std::vector<float> mean = RandomFloats(channels, ++seed, -2.0f, 2.0f);
    const std::vector<float> variance = RandomFloats(channels, ++seed, 0.1f, 3.0f);
    const float epsilon = 1e-5f;
    float* y = Filled(rows * channels, kNaN);
    kernels_->BatchNormForwardInference(Upload(x), rows, channels, Upload(gamma), Upload(beta),
                                        Upload(mean), Upload(variance), epsilon, y);
    const std::vector<double> expected =
        ReferenceBatchNormApply(x, rows, channels, gamma, beta, mean, variance, epsilon);
    EXPECT_TRUE(AllNear(Download(y, rows * channels), expected, 1e-5, 1e-4));
  }
}

struct BatchNormGradients {
  std::vector<double> dgamma, dbeta, dx;
  std::vector<double> dgamma_magnitude, dbeta_magnitude, dx_magnitude;
};

BatchNormGradients ReferenceBatchNormBackward(const std::vector<float>& x,
                                              const std::vector<float>& dy, int64_t rows,
                                              int channels, const std::vector<float>& gamma,
                                              const std::vector<float>& mean,
                                              const std::vector<float>& variance, double epsilon) {
  BatchNormGradients g;
  g.dgamma.assign(channels, 0.0);
  g.dbeta.assign(channels, 0.0);
  g.dgamma_magnitude.assign(channels, 0.0);
  g.dbeta_magnitude.assign(channels, 0.0);
  std::vector<double> inv_std(channels);
  for (int c = 0; c < channels; ++c) inv_std[c] = 1.0 / std::sqrt(double{variance[c]} + epsilon);
  auto xhat = [&](int64_t r, int c) {
    return (x[r * channels + c] - double{mean[c]}) * inv_std[c];
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < channels; ++c) {
      const double d = dy[r * channels + c];
      g.dbeta[c] += d;
      g.dbeta_magnitude[c] += std::abs(d);
      g.dgamma[c] += d * xhat(r, c);
      g.dgamma_magnitude[c] += std::abs(d * xhat(r, c));
    }
  }
  g.dx.resize(rows * channels);
  g.dx_magnitude.resize(rows * channels);
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < channels; ++c) {
      const double scale = gamma[c] * inv_std[c];
      const double d = dy[r * channels + c];
      const double correction = (g.dbeta[c] + xhat(r, c) * g.dgamma[c]) / rows;
      g.dx[r * channels + c] = scale * (d - correction);
      g.dx_magnitude[r * channels + c] =
          std::abs(scale) *
          (std::abs(d) +
           (g.dbeta_magnitude[c] + std::abs(xhat(r, c)) * g.dgamma_magnitude[c]) / rows);
    }
  }
  return g;
}

TEST_P(KernelsConformanceTest, BatchNormBackward) {
  uint32_t seed = 190;
  for (const BatchNormShape& shape : kBatchNormShapes) {
    for (bool in_place : {false, true}) {
      const int64_t rows = shape.rows;
      const int channels = shape.channels;
      SCOPED_TRACE(absl::StrCat("rows ", rows, " channels ", channels, in_place ? " dx = dy" : ""));
      const std::vector<float> x = BatchNormInput(rows, channels, ++seed);
      const std::vector<float> dy = RandomFloats(rows * channels, ++seed);
      const std::vector<float> gamma = RandomFloats(channels, ++seed, 0.5f, 2.0f);
      const float epsilon = 1e-3f;
      // The statistics as BatchNormForwardTraining would give them (rounded to float).
      const BatchNormStats stats = ReferenceBatchNormStats(x, rows, channels);
      const std::vector<float> mean(stats.mean.begin(), stats.mean.end());
      const std::vector<float> variance(stats.variance.begin(), stats.variance.end());
      float* dy_device = Upload(dy);
      float* dx = in_place ? dy_device : Filled(rows * channels, kNaN);
      float* dgamma = Filled(channels, kNaN);
      float* dbeta = Filled(channels, kNaN);
      kernels_->BatchNormBackward(Upload(x), dy_device, rows, channels, Upload(gamma), Upload(mean),
                                  Upload(variance), epsilon, dgamma, dbeta, dx);
      const BatchNormGradients ref =
          ReferenceBatchNormBackward(x, dy, rows, channels, gamma, mean, variance, epsilon);
      EXPECT_TRUE(AllWithin(Download(dbeta, channels), ref.dbeta,
                            ScaledTolerance(ref.dbeta_magnitude, 1e-5)));
      EXPECT_TRUE(AllWithin(Download(dgamma, channels), ref.dgamma,
                            ScaledTolerance(ref.dgamma_magnitude, 1e-5)));
      EXPECT_TRUE(AllWithin(Download(dx, rows * channels), ref.dx,
                            ScaledTolerance(ref.dx_magnitude, 1e-5)));
    }
  }
}

// L = sum(w * y) for y = BatchNormForwardTraining(x, gamma, beta), all in double.
double BatchNormLoss(const std::vector<double>& x, int64_t rows, int channels,
                     const std::vector<double>& gamma, const std::vector<double>& beta,
                     double epsilon, const std::vector<float>& w) {
  double loss = 0;
  for (int c = 0; c < channels; ++c) {
    double mean = 0, variance = 0;
    for (int64_t r = 0; r < rows; ++r) mean += x[r * channels + c];
    mean /= rows;
    for (int64_t r = 0; r < rows; ++r) {
      variance += (x[r * channels + c] - mean) * (x[r * channels + c] - mean);
    }
    variance /= rows;
    for (int64_t r = 0; r < rows; ++r) {
      const double y =
          gamma[c] * (x[r * channels + c] - mean) / std::sqrt(variance + epsilon) + beta[c];
      loss += w[r * channels + c] * y;
    }
  }
  return loss;
}

// The analytic gradients of BatchNormBackward (given the training pass's statistics) agree
// with central differences of the training pass, in double.
TEST_P(KernelsConformanceTest, BatchNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 6;
  const int channels = 3;
  const float epsilon = 1e-3f;
  const std::vector<float> x = RandomFloats(rows * channels, 210, -2.0f, 2.0f);
  const std::vector<float> gamma = RandomFloats(channels, 211, 0.5f, 2.0f);
  const std::vector<float> beta = RandomFloats(channels, 212);
  const std::vector<float> w = RandomFloats(rows * channels, 213);  // dL/dy

  float* x_device = Upload(x);
  float* gamma_device = Upload(gamma);
  float* y = Filled(rows * channels, kNaN);
  float* mean = Filled(channels, kNaN);
  float* variance = Filled(channels, kNaN);
  kernels_->BatchNormForwardTraining(x_device, rows, channels, gamma_device, Upload(beta), epsilon,
                                     y, mean, variance);
  float* dx = Filled(rows * channels, kNaN);
  float* dgamma = Filled(channels, kNaN);
  float* dbeta = Filled(channels, kNaN);
  kernels_->BatchNormBackward(x_device, Upload(w), rows, channels, gamma_device, mean, variance,
                              epsilon, dgamma, dbeta, dx);

  std::vector<double> xd(x.begin(), x.end());
  std::vector<double> gd(gamma.begin(), gamma.end());
  std::vector<double> bd(beta.begin(), beta.end());
  const double h = 1e-5;
  auto central = [&](double* v) {
    const double saved = *v;
    *v = saved + h;
    const double up = BatchNormLoss(xd, rows, channels, gd, bd, epsilon, w);
    *v = saved - h;
    const double down = BatchNormLoss(xd, rows, channels, gd, bd, epsilon, w);
    *v = saved;
    return (up - down) / (2 * h);
  };
  std::vector<double> fd_dx(rows * channels), fd_dgamma(channels), fd_dbeta(channels);
  for (int64_t i = 0; i < rows * channels; ++i) fd_dx[i] = central(&xd[i]);
  for (int c = 0; c < channels; ++c) {
    fd_dgamma[c] = central(&gd[c]);
    fd_dbeta[c] = central(&bd[c]);
  }
  EXPECT_TRUE(AllNear(Download(dx, rows * channels), fd_dx, 1e-3, 1e-4));
  EXPECT_TRUE(AllNear(Download(dgamma, channels), fd_dgamma, 1e-3, 1e-4));
  EXPECT_TRUE(AllNear(Download(dbeta, channels), fd_dbeta, 1e-3, 1e-4));
}

// Reductions give the same bits on every run (no atomics).
TEST_P(KernelsConformanceTest, ReductionsAreDeterministic) {
  const int64_t rows = 70000;
  const int channels = 16;
  const std::vector<float> x = BatchNormInput(rows, channels, 230);
  const std::vector<float> dy0 = RandomFloats(rows * channels, 231);
  float* x_device = Upload(x);
  float* dy = Upload(dy0);
  float* gamma = Filled(channels, 1.5f);
  float* beta = Filled(channels, 0.25f);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    float* y = Filled(rows * channels, kNaN);
    float* mean = Filled(channels, kNaN);
    float* variance = Filled(channels, kNaN);
    float* dx = Filled(rows * channels, kNaN);
    float* dgamma = Filled(channels, kNaN);
    float* dbeta = Filled(channels, kNaN);
    float* dbias = Filled(channels, kNaN);
    kernels_->BatchNormForwardTraining(x_device, rows, channels, gamma, beta, 1e-3f, y, mean,
                                       variance);
    kernels_->BatchNormBackward(x_device, dy, rows, channels, gamma, mean, variance, 1e-3f, dgamma,
                                dbeta, dx);
    kernels_->BiasGrad(dy, rows, channels, dbias);
    std::vector<float> all;
    for (const auto& [p, n] : std::vector<std::pair<float*, int64_t>>{{y, rows * channels},
                                                                      {mean, channels},
                                                                      {variance, channels},
                                                                      {dx, rows * channels},
                                                                      {dgamma, channels},
                                                                      {dbeta, channels},
                                                                      {dbias, channels}}) {
      const std::vector<float> part = Download(p, n);
      all.insert(all.end(), part.begin(), part.end());
    }
    runs.push_back(std::move(all));
  }
  EXPECT_TRUE(runs[0] == runs[1]);
}

// Tall and skinny (a convolution's output) and wider than one tile of columns.
TEST_P(KernelsConformanceTest, BiasGradOfTallMatrices) {
  uint32_t seed = 240;
  for (const auto& [rows, cols] : std::vector<std::pair<int, int>>{
           {100000, 16}, {30011, 3}, {2000, 300}, {1024, 64}, {1023, 64}}) {
    SCOPED_TRACE(absl::StrCat("rows ", rows, " cols ", cols));
    const std::vector<float> dy = RandomFloats(int64_t{rows} * cols, ++seed);
    float* dbias = Filled(cols, kNaN);
    kernels_->BiasGrad(Upload(dy), rows, cols, dbias);
    std::vector<double> expected(cols, 0.0);
    std::vector<double> magnitude(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        expected[c] += dy[r * cols + c];
        magnitude[c] += std::abs(dy[r * cols + c]);
      }
    }
    EXPECT_TRUE(AllWithin(Download(dbias, cols), expected, ScaledTolerance(magnitude, 1e-5)));
  }
}

}  // namespace
}  // namespace pscluster
