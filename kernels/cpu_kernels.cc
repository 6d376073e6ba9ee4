// The CPU backend: Eigen's GEMM for the matrix products, plain loops for the rest.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/kernels.h"

namespace pscluster {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
using MatrixMap = Eigen::Map<RowMajorMatrix>;

// Cache-line alignment lets Eigen's packing read whole lines; it needs no more.
constexpr std::align_val_t kAlignment{64};

// c += alpha * a * b, where a and b are (possibly transposed) views; Eigen folds alpha and the
// transposes into one GEMM call without copies.
template <typename A, typename B>
void AccumulateProduct(float alpha, const A& a, const B& b, MatrixMap* c) {
  c->noalias() += alpha * a * b;
}

float Sigmoid(float x) {
  // Split by sign so exp never overflows.
  if (x >= 0) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

// Thread-compatible, like every Kernels.
class CpuKernels final : public Kernels {
 public:
  CpuKernels() = default;
  CpuKernels(const CpuKernels&) = delete;
  CpuKernels& operator=(const CpuKernels&) = delete;

  ~CpuKernels() override {
    for (void* p : allocations_) ::operator delete(p, kAlignment);
  }

  std::string name() const override { return "cpu"; }

  absl::StatusOr<float*> AllocateFloats(int64_t n) override {
    absl::StatusOr<void*> p = Allocate(n, sizeof(float), "floats");
    if (!p.ok()) return p.status();
    return static_cast<float*>(*p);
  }

  absl::StatusOr<int32_t*> AllocateInts(int64_t n) override {
    absl::StatusOr<void*> p = Allocate(n, sizeof(int32_t), "ints");
    if (!p.ok()) return p.status();
    return static_cast<int32_t*>(*p);
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    const bool allocated_here = allocations_.erase(p) == 1;
    CHECK(allocated_here) << "Free(" << p << "): not allocated by this Kernels";
    ::operator delete(p, kAlignment);
  }

  void CopyToDevice(const float* host, float* device, int64_t n) override {
    if (n > 0) std::memcpy(device, host, n * sizeof(float));
  }
  void CopyToDevice(const int32_t* host, int32_t* device, int64_t n) override {
    if (n > 0) std::memcpy(device, host, n * sizeof(int32_t));
  }
  void CopyToHost(const float* device, float* host, int64_t n) override {
    if (n > 0) std::memcpy(host, device, n * sizeof(float));
  }
  void CopyToHostInts(const int32_t* device, int32_t* host, int64_t n) override {
    if (n > 0) std::memcpy(host, device, n * sizeof(int32_t));
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    if (m <= 0 || n <= 0) return;
    MatrixMap c_map(c, m, n);
    // BLAS semantics: beta == 0 overwrites c without reading it (it may hold NaN).
    if (beta == 0.0f) {
      c_map.setZero();
    } else if (beta != 1.0f) {
      c_map *= beta;
    }
    if (k <= 0 || alpha == 0.0f) return;
    const ConstMatrixMap a_map(a, trans_a ? k : m, trans_a ? m : k);
    const ConstMatrixMap b_map(b, trans_b ? n : k, trans_b ? k : n);
    if (!trans_a && !trans_b) {
      AccumulateProduct(alpha, a_map, b_map, &c_map);
    } else if (!trans_a && trans_b) {
      AccumulateProduct(alpha, a_map, b_map.transpose(), &c_map);
    } else if (trans_a && !trans_b) {
      AccumulateProduct(alpha, a_map.transpose(), b_map, &c_map);
    } else {
      AccumulateProduct(alpha, a_map.transpose(), b_map.transpose(), &c_map);
    }
  }

  void AddBias(const float* bias, int rows, int cols, float* x) override {
    for (int r = 0; r < rows; ++r) {
      float* row = x + int64_t{r} * cols;
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
  }

  void BiasGrad(const float* dy, int rows, int cols, float* dbias) override {
    if (cols <= 0) return;
    std::fill_n(dbias, cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* row = dy + int64_t{r} * cols;
      for (int c = 0; c < cols; ++c) dbias[c] += row[c];
    }
  }

  void ActivationForward(Activation f, const float* x, int64_t n, float* y) override {
    switch (f) {
      case Activation::kLinear:
        if (x != y && n > 0) std::memmove(y, x, n * sizeof(float));
        return;
      case Activation::kRelu:
        for (int64_t i = 0; i < n; ++i) y[i] = std::max(x[i], 0.0f);
        return;
      case Activation::kSigmoid:
        for (int64_t i = 0; i < n; ++i) y[i] = Sigmoid(x[i]);
        return;
      case Activation::kTanh:
        for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
        return;
    }
    LOG(FATAL) << "unknown activation " << static_cast<int>(f);
  }

  void ActivationBackward(Activation f, const float* y, const float* dy, int64_t n,
                          float* dx) override {
    switch (f) {
      case Activation::kLinear:
        if (dy != dx && n > 0) std::memmove(dx, dy, n * sizeof(float));
        return;
      case Activation::kRelu:
        for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        return;
      case Activation::kSigmoid:
        for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
        return;
      case Activation::kTanh:
        for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
        return;
    }
    LOG(FATAL) << "unknown activation " << static_cast<int>(f);
  }

  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int classes,
                           float* loss, float* dlogits) override {
    if (rows <= 0 || classes <= 0) return;
    const float inv_rows = 1.0f / static_cast<float>(rows);
    for (int r = 0; r < rows; ++r) {
      const float* x = logits + int64_t{r} * classes;
      float* dx = dlogits + int64_t{r} * classes;
      const float max = *std::max_element(x, x + classes);
      float sum = 0.0f;
      for (int c = 0; c < classes; ++c) sum += std::exp(x[c] - max);
      const int label = labels[r];
      // A label outside [0, classes) has no probability: the loss is NaN so it cannot go
      // unnoticed, and nothing out of bounds is read. The CUDA backend does the same.
      const bool label_ok = label >= 0 && label < classes;
      loss[r] =
          label_ok ? std::log(sum) - (x[label] - max) : std::numeric_limits<float>::quiet_NaN();
      const float inv_sum = 1.0f / sum;
      for (int c = 0; c < classes; ++c) {
        const float onehot = c == label ? 1.0f : 0.0f;
        dx[c] = (std::exp(x[c] - max) * inv_sum - onehot) * inv_rows;
      }
    }
  }

  void ArgMax(const float* logits, int rows, int classes, int32_t* out) override {
    if (classes <= 0) return;
    for (int r = 0; r < rows; ++r) {
      const float* x = logits + int64_t{r} * classes;
      // Ties go to the lowest index, as in the CUDA backend.
      out[r] = static_cast<int32_t>(std::max_element(x, x + classes) - x);
    }
  }

  void SigmoidCrossEntropy(const float* logits, const float* labels, int rows, float* loss,
                           float* dlogits) override {
    if (rows <= 0) return;
    const float inv_rows = 1.0f / static_cast<float>(rows);
    for (int r = 0; r < rows; ++r) {
      const float z = logits[r];
      const float y = labels[r];
      loss[r] = std::max(z, 0.0f) - z * y + std::log1p(std::exp(-std::abs(z)));
      dlogits[r] = (Sigmoid(z) - y) * inv_rows;
    }
  }

  void EmbeddingBagForward(const float* rows, const int32_t* row_index, const int32_t* offsets,
                           int batch, int dim, bool mean, int out_stride, int out_col,
                           float* out) override {
    for (int b = 0; b < batch; ++b) {
      float* o = out + int64_t{b} * out_stride + out_col;
      std::fill_n(o, dim, 0.0f);
      const int32_t begin = offsets[b];
      const int32_t end = offsets[b + 1];
      for (int32_t i = begin; i < end; ++i) {
        const float* row = rows + int64_t{row_index[i]} * dim;
        for (int d = 0; d < dim; ++d) o[d] += row[d];
      }
      if (mean && end > begin) {
        const float scale = 1.0f / static_cast<float>(end - begin);
        for (int d = 0; d < dim; ++d) o[d] *= scale;
      }
    }
  }

  void EmbeddingBagBackward(const float* dout, const int32_t* row_index, const int32_t* offsets,
                            int batch, int dim, bool mean, int out_stride, int out_col,
                            float* drows) override {
    for (int b = 0; b < batch; ++b) {
      const float* g = dout + int64_t{b} * out_stride + out_col;
      const int32_t begin = offsets[b];
      const int32_t end = offsets[b + 1];
      const float scale = mean && end > begin ? 1.0f / static_cast<float>(end - begin) : 1.0f;
      for (int32_t i = begin; i < end; ++i) {
        float* row = drows + int64_t{row_index[i]} * dim;
        for (int d = 0; d < dim; ++d) row[d] += g[d] * scale;
      }
    }
  }

  void Axpy(int64_t n, float alpha, const float* x, float* y) override {
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }

  void Fill(float* x, int64_t n, float value) override {
    if (n > 0) std::fill_n(x, n, value);
  }

  void GatherRows(const void* table, const int32_t* index, int n, int64_t row, void* out) override {
    const char* from = static_cast<const char*>(table);
    char* to = static_cast<char*>(out);
    const int64_t bytes = row * 4;
    for (int i = 0; i < n; ++i) std::memcpy(to + i * bytes, from + index[i] * bytes, bytes);
  }

  void ApplyUpdate(const ElementwiseUpdate& u, int64_t n, const float* grad, float* var,
                   float* slot0, float* slot1) override {
    using Kind = ElementwiseUpdate::Kind;
    switch (u.kind) {
      case Kind::kSgd:
        for (int64_t i = 0; i < n; ++i) var[i] -= grad[i] * u.lr;
        return;
      case Kind::kMomentum:
        for (int64_t i = 0; i < n; ++i) {
          slot0[i] = slot0[i] * u.momentum + grad[i];
          var[i] -= u.nesterov ? grad[i] * u.lr + slot0[i] * u.momentum * u.lr : slot0[i] * u.lr;
        }
        return;
      case Kind::kAdam: {
        const float one_minus_beta1 = 1.0f - u.beta1;
        const float one_minus_beta2 = 1.0f - u.beta2;
        for (int64_t i = 0; i < n; ++i) {
          const float g = grad[i];
          slot0[i] += (g - slot0[i]) * one_minus_beta1;
          slot1[i] += (g * g - slot1[i]) * one_minus_beta2;
          var[i] -= (slot0[i] * u.lr) / (std::sqrt(slot1[i]) + u.epsilon);
        }
        return;
      }
      case Kind::kMovingAverage: {
        const float decay = 1.0f - u.momentum;
        for (int64_t i = 0; i < n; ++i) var[i] -= (var[i] - grad[i]) * decay;
        return;
      }
    }
  }

  void Scale(int64_t n, float alpha, float* y) override {
    for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
  }

  void ScaleCopy(int64_t n, float alpha, const float* x, float* y) override {
    if (alpha == 1.0f) {
      if (x != y && n > 0) std::memmove(y, x, n * sizeof(float));
      return;
    }
    for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];
  }

  void Add(int64_t n, const float* a, const float* b, float* out) override {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }

  void Im2Col(const ConvGeometry& g, const float* x, float* cols) override {
    const int64_t channels = g.channels;
    const int64_t row_floats = int64_t{g.kernel_w} * channels;
    float* out = cols;
    for (int n = 0; n < g.batch; ++n) {
      const float* image = x + int64_t{n} * g.height * g.width * channels;
      for (int oh = 0; oh < g.out_h; ++oh) {
        for (int ow = 0; ow < g.out_w; ++ow) {
          const int w0 = ow * g.stride_w - g.pad_left;
          // The kernel columns [kw_begin, kw_end) fall inside the image: one contiguous run.
          const int kw_begin = std::max(0, -w0);
          const int kw_end = std::min(g.kernel_w, g.width - w0);
          for (int kh = 0; kh < g.kernel_h; ++kh, out += row_floats) {
            const int ih = oh * g.stride_h - g.pad_top + kh;
            if (ih < 0 || ih >= g.height || kw_begin >= kw_end) {
              std::memset(out, 0, row_floats * sizeof(float));
              continue;
            }
            if (kw_begin > 0) std::memset(out, 0, kw_begin * channels * sizeof(float));
            std::memcpy(out + kw_begin * channels,
                        image + (int64_t{ih} * g.width + w0 + kw_begin) * channels,
                        (kw_end - kw_begin) * channels * sizeof(float));
            if (kw_end < g.kernel_w) {
              std::memset(out + kw_end * channels, 0,
                          (g.kernel_w - kw_end) * channels * sizeof(float));
            }
          }
        }
      }
    }
  }

  void Col2Im(const ConvGeometry& g, const float* dcols, float* dx) override {
    const int64_t channels = g.channels;
    if (g.input_size() > 0) std::fill_n(dx, g.input_size(), 0.0f);
    const float* in = dcols;
    for (int n = 0; n < g.batch; ++n) {
      float* image = dx + int64_t{n} * g.height * g.width * channels;
      for (int oh = 0; oh < g.out_h; ++oh) {
        for (int ow = 0; ow < g.out_w; ++ow) {
          for (int kh = 0; kh < g.kernel_h; ++kh) {
            const int ih = oh * g.stride_h - g.pad_top + kh;
            for (int kw = 0; kw < g.kernel_w; ++kw, in += channels) {
              const int iw = ow * g.stride_w - g.pad_left + kw;
              if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
              float* d = image + (int64_t{ih} * g.width + iw) * channels;
              for (int64_t c = 0; c < channels; ++c) d[c] += in[c];
            }
          }
        }
      }
    }
  }

  void MaxPoolForward(const ConvGeometry& g, const float* x, float* y, int32_t* argmax) override {
    const int64_t channels = g.channels;
    for (int n = 0; n < g.batch; ++n) {
      const int64_t image = int64_t{n} * g.height * g.width;
      for (int oh = 0; oh < g.out_h; ++oh) {
        const int h_begin = std::max(0, oh * g.stride_h - g.pad_top);
        const int h_end = std::min(g.height, oh * g.stride_h - g.pad_top + g.kernel_h);
        for (int ow = 0; ow < g.out_w; ++ow) {
          const int w_begin = std::max(0, ow * g.stride_w - g.pad_left);
          const int w_end = std::min(g.width, ow * g.stride_w - g.pad_left + g.kernel_w);
          const int64_t o = ((int64_t{n} * g.out_h + oh) * g.out_w + ow) * channels;
          float* y_out = y + o;
          int32_t* a_out = argmax + o;
          bool first = true;
          for (int ih = h_begin; ih < h_end; ++ih) {
            for (int iw = w_begin; iw < w_end; ++iw) {
              const int64_t base = (image + int64_t{ih} * g.width + iw) * channels;
              const float* v = x + base;
              if (first) {
                for (int64_t c = 0; c < channels; ++c) {
                  y_out[c] = v[c];
                  a_out[c] = static_cast<int32_t>(base + c);
                }
                first = false;
                continue;
              }
              // Strictly greater: ties keep the first (lowest-index) position.
              for (int64_t c = 0; c < channels; ++c) {
                if (v[c] > y_out[c]) {
                  y_out[c] = v[c];
                  a_out[c] = static_cast<int32_t>(base + c);
                }
              }
            }
          }
          if (first) {
            // A window wholly in the padding (impossible for SAME and VALID geometry).
            for (int64_t c = 0; c < channels; ++c) {
              y_out[c] = 0.0f;
              a_out[c] = -1;
            }
          }
        }
      }
    }
  }

  void MaxPoolBackward(const ConvGeometry& g, const float* dy, const int32_t* argmax,
                       float* dx) override {
    const int64_t input_size = g.input_size();
    if (input_size > 0) std::fill_n(dx, input_size, 0.0f);
    const int64_t outputs = g.output_positions() * g.channels;
    for (int64_t o = 0; o < outputs; ++o) {
      const int32_t i = argmax[o];
      if (i >= 0 && i < input_size) dx[i] += dy[o];
    }
  }

  // Each output window's positions inside the input, visited with the window's divisor.
  template <typename Visit>
  static void ForEachWindow(const ConvGeometry& g, Visit visit) {
    for (int n = 0; n < g.batch; ++n) {
      const int64_t image = int64_t{n} * g.height * g.width;
      for (int oh = 0; oh < g.out_h; ++oh) {
        const int h_begin = std::max(0, oh * g.stride_h - g.pad_top);
        const int h_end = std::min(g.height, oh * g.stride_h - g.pad_top + g.kernel_h);
        for (int ow = 0; ow < g.out_w; ++ow) {
          const int w_begin = std::max(0, ow * g.stride_w - g.pad_left);
          const int w_end = std::min(g.width, ow * g.stride_w - g.pad_left + g.kernel_w);
          const int count = std::max(h_end - h_begin, 0) * std::max(w_end - w_begin, 0);
          const int64_t o = ((int64_t{n} * g.out_h + oh) * g.out_w + ow) * g.channels;
          for (int ih = h_begin; ih < h_end; ++ih) {
            for (int iw = w_begin; iw < w_end; ++iw) {
              visit(o, (image + int64_t{ih} * g.width + iw) * g.channels, count);
            }
          }
        }
      }
    }
  }

  void AvgPoolForward(const ConvGeometry& g, const float* x, float* y) override {
    const int64_t outputs = g.output_positions() * g.channels;
    if (outputs > 0) std::fill_n(y, outputs, 0.0f);
    const int64_t channels = g.channels;
    ForEachWindow(g, [&](int64_t o, int64_t i, int count) {
      const float scale = 1.0f / static_cast<float>(count);
      for (int64_t c = 0; c < channels; ++c) y[o + c] += x[i + c] * scale;
    });
  }

  void AvgPoolBackward(const ConvGeometry& g, const float* dy, float* dx) override {
    const int64_t input_size = g.input_size();
    if (input_size > 0) std::fill_n(dx, input_size, 0.0f);
    const int64_t channels = g.channels;
    ForEachWindow(g, [&](int64_t o, int64_t i, int count) {
      const float scale = 1.0f / static_cast<float>(count);
      for (int64_t c = 0; c < channels; ++c) dx[i + c] += dy[o + c] * scale;
    });
  }

  void GlobalAvgPoolForward(const float* x, int batch, int positions, int channels,
                            float* y) override {
    if (channels <= 0) return;
    std::vector<double> sum(channels);
    for (int n = 0; n < batch; ++n) {
      std::fill(sum.begin(), sum.end(), 0.0);
      const float* image = x + int64_t{n} * positions * channels;
      for (int p = 0; p < positions; ++p) {
        const float* v = image + int64_t{p} * channels;
        for (int c = 0; c < channels; ++c) sum[c] += v[c];
      }
      float* out = y + int64_t{n} * channels;
      for (int c = 0; c < channels; ++c) {
        out[c] = positions > 0 ? static_cast<float>(sum[c] / positions) : 0.0f;
      }
    }
  }

  void GlobalAvgPoolBackward(const float* dy, int batch, int positions, int channels,
                             float* dx) override {
    if (positions <= 0 || channels <= 0) return;
    const float scale = 1.0f / static_cast<float>(positions);
    for (int n = 0; n < batch; ++n) {
      const float* d = dy + int64_t{n} * channels;
      float* image = dx + int64_t{n} * positions * channels;
      for (int p = 0; p < positions; ++p) {
        float* out = image + int64_t{p} * channels;
        for (int c = 0; c < channels; ++c) out[c] = d[c] * scale;
      }
    }
  }

  void BatchNormForwardTraining(const float* x, int64_t rows, int channels, const float* gamma,
                                const float* beta, float epsilon, float* y, float* mean,
                                float* variance) override {
    if (channels <= 0) return;
    if (rows <= 0) {
      std::fill_n(mean, channels, 0.0f);
      std::fill_n(variance, channels, 0.0f);
      return;
    }
    // Two passes in double: the mean, then the squared deviations from it.
    std::vector<double> sum(channels, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = x + r * channels;
      for (int c = 0; c < channels; ++c) sum[c] += v[c];
    }
    std::vector<double> mu(channels);
    for (int c = 0; c < channels; ++c) mu[c] = sum[c] / static_cast<double>(rows);
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = x + r * channels;
      for (int c = 0; c < channels; ++c) {
        const double d = v[c] - mu[c];
        sum[c] += d * d;
      }
    }
    for (int c = 0; c < channels; ++c) {
      mean[c] = static_cast<float>(mu[c]);
      variance[c] = static_cast<float>(sum[c] / static_cast<double>(rows));
    }
    BatchNormForwardInference(x, rows, channels, gamma, beta, mean, variance, epsilon, y);
  }

  void BatchNormForwardInference(const float* x, int64_t rows, int channels, const float* gamma,
                                 const float* beta, const float* mean, const float* variance,
                                 float epsilon, float* y) override {
    if (channels <= 0) return;
    std::vector<float> scale(channels);
    for (int c = 0; c < channels; ++c) scale[c] = gamma[c] / std::sqrt(variance[c] + epsilon);
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = x + r * channels;
      float* out = y + r * channels;
      for (int c = 0; c < channels; ++c) out[c] = (v[c] - mean[c]) * scale[c] + beta[c];
    }
  }

  void BatchNormBackward(const float* x, const float* dy, int64_t rows, int channels,
                         const float* gamma, const float* mean, const float* variance,
                         float epsilon, float* dgamma, float* dbeta, float* dx) override {
    if (channels <= 0) return;
    std::vector<float> inv_std(channels);
    for (int c = 0; c < channels; ++c) inv_std[c] = 1.0f / std::sqrt(variance[c] + epsilon);
    std::vector<double> sum_dy(channels, 0.0);
    std::vector<double> sum_dy_xhat(channels, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = x + r * channels;
      const float* d = dy + r * channels;
      for (int c = 0; c < channels; ++c) {
        const float xhat = (v[c] - mean[c]) * inv_std[c];
        sum_dy[c] += d[c];
        sum_dy_xhat[c] += static_cast<double>(d[c]) * xhat;
      }
    }
    for (int c = 0; c < channels; ++c) {
      dbeta[c] = static_cast<float>(sum_dy[c]);
      dgamma[c] = static_cast<float>(sum_dy_xhat[c]);
    }
    if (rows <= 0) return;
    const float inv_rows = 1.0f / static_cast<float>(rows);
    std::vector<float> scale(channels);
    std::vector<float> mean_dy(channels);
    std::vector<float> mean_dy_xhat(channels);
    for (int c = 0; c < channels; ++c) {
      scale[c] = gamma[c] * inv_std[c];
      mean_dy[c] = dbeta[c] * inv_rows;
      mean_dy_xhat[c] = dgamma[c] * inv_rows;
    }
    // dx may alias dy: each element's dy is read before its dx is written.
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = x + r * channels;
      const float* d = dy + r * channels;
      float* out = dx + r * channels;
      for (int c = 0; c < channels; ++c) {
        const float xhat = (v[c] - mean[c]) * inv_std[c];
        out[c] = scale[c] * (d[c] - mean_dy[c] - xhat * mean_dy_xhat[c]);
      }
    }
  }

  bool device_is_host() const override { return true; }

  absl::StatusOr<void*> AllocateHost(int64_t bytes) override {
    void* p =
        ::operator new(static_cast<size_t>(std::max<int64_t>(bytes, 1)), kAlignment, std::nothrow);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: out of memory allocating ", bytes, " bytes of host memory"));
    }
    return p;
  }
  void FreeHost(void* p) override {
    if (p != nullptr) ::operator delete(p, kAlignment);
  }

  void CopyToDeviceAsync(Stream, const void* host, void* device, int64_t bytes) override {
    if (bytes > 0 && host != device) std::memcpy(device, host, static_cast<size_t>(bytes));
  }
  void CopyToHostAsync(Stream, const void* device, void* host, int64_t bytes) override {
    if (bytes > 0 && host != device) std::memcpy(host, device, static_cast<size_t>(bytes));
  }
  void CopyRowsToDeviceAsync(Stream, const void* host, int64_t host_pitch, void* device,
                             int64_t device_pitch, int64_t row_bytes, int64_t rows) override {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(device) + r * device_pitch,
                  static_cast<const char*>(host) + r * host_pitch, static_cast<size_t>(row_bytes));
    }
  }

  // Every call completes at once: an event is always reached.
  std::unique_ptr<Event> NewEvent() override { return std::make_unique<Event>(); }
  void Record(Event*, Stream) override {}
  void Wait(Stream, Event*) override {}
  void Synchronize(Event*) override {}

 private:
  absl::StatusOr<void*> Allocate(int64_t n, int64_t element_size, const char* what) {
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", n, " ", what));
    }
    if (n > std::numeric_limits<int64_t>::max() / element_size) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", n, " ", what, ": the size overflows"));
    }
    // At least one element, so that every allocation is a distinct pointer.
    const int64_t bytes = std::max<int64_t>(n, 1) * element_size;
    void* p = ::operator new(static_cast<size_t>(bytes), kAlignment, std::nothrow);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: out of memory allocating ", bytes, " bytes for ", n, " ", what));
    }
    allocations_.insert(p);
    return p;
  }

  // Every live allocation; the destructor frees what the caller did not.
  absl::flat_hash_set<void*> allocations_;
};

}  // namespace

std::unique_ptr<Kernels> NewCpuKernels() { return std::make_unique<CpuKernels>(); }

}  // namespace pscluster
