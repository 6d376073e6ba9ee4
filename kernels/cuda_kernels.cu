// The CUDA backend: cuBLAS for the matrix products, small kernels for the rest, all issued on
// one stream. Only built with --config=cuda.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "kernels/cuda_device.h"
#include "kernels/kernels.h"

// After construction a failing CUDA or cuBLAS call means a bug or a broken device; the
// interface has no way to report it, so the process stops with the call that failed.
#define PS_CUDA_CHECK(call)                                                     \
  do {                                                                          \
    const cudaError_t ps_cuda_error_ = (call);                                  \
    if (ps_cuda_error_ != cudaSuccess) {                                        \
      LOG(FATAL) << #call << " failed: " << cudaGetErrorString(ps_cuda_error_); \
    }                                                                           \
  } while (0)

#define PS_CUBLAS_CHECK(call)                                                         \
  do {                                                                                \
    const cublasStatus_t ps_cublas_status_ = (call);                                  \
    if (ps_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                 \
      LOG(FATAL) << #call << " failed: " << cublasGetStatusString(ps_cublas_status_); \
    }                                                                                 \
  } while (0)

// Checks that a kernel launch was accepted; errors while it runs surface at the next
// synchronization (CopyToHost), which is checked too.
#define PS_CUDA_CHECK_LAUNCH(kernel_name)                              \
  do {                                                                 \
    const cudaError_t ps_cuda_error_ = cudaGetLastError();             \
    if (ps_cuda_error_ != cudaSuccess) {                               \
      LOG(FATAL) << "launching " << kernel_name                        \
                 << " failed: " << cudaGetErrorString(ps_cuda_error_); \
    }                                                                  \
  } while (0)

namespace pscluster {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces v over the block and returns the result to every thread. REQUIRES: blockDim.x is a
// multiple of 32 and at most 1024; every thread of the block calls it. `scratch` holds 32.
template <typename Op>
__device__ float BlockAllReduce(float v, Op op, float* scratch) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(kFullWarp, v, offset));
  }
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarpSize;
  v = scratch[0];
  for (int w = 1; w < warps; ++w) v = op(v, scratch[w]);
  // The caller may reuse scratch for its next reduction.
  __syncthreads();
  return v;
}

__device__ float StableSigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

__global__ void FillKernel(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = value;
  }
}

__global__ void GatherRowsKernel(const uint32_t* table, const int32_t* index, int64_t total,
                                 int64_t row, uint32_t* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / row;
    out[i] = table[int64_t{index[r]} * row + (i - r * row)];
  }
}

// ElementwiseUpdate's kinds, one kernel each (see kernels.h for the formulas).
__global__ void SgdUpdateKernel(int64_t n, float lr, const float* grad, float* var) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    var[i] -= grad[i] * lr;
  }
}

__global__ void MomentumUpdateKernel(int64_t n, float lr, float momentum, bool nesterov,
                                     const float* grad, float* var, float* accum) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float a = accum[i] * momentum + grad[i];
    accum[i] = a;
    var[i] -= nesterov ? grad[i] * lr + a * momentum * lr : a * lr;
  }
}

__global__ void AdamUpdateKernel(int64_t n, float lr, float one_minus_beta1, float one_minus_beta2,
                                 float epsilon, const float* grad, float* var, float* m, float* v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i];
    const float mi = m[i] + (g - m[i]) * one_minus_beta1;
    const float vi = v[i] + (g * g - v[i]) * one_minus_beta2;
    m[i] = mi;
    v[i] = vi;
    var[i] -= (mi * lr) / (sqrtf(vi) + epsilon);
  }
}

__global__ void MovingAverageUpdateKernel(int64_t n, float decay, const float* value, float* var) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    var[i] -= (var[i] - value[i]) * decay;
  }
}

__global__ void ScaleKernel(float* x, int64_t n, float alpha) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] *= alpha;
  }
}

__global__ void AxpyKernel(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] += alpha * x[i];
  }
}

__global__ void AddBiasKernel(const float* bias, int64_t n, int cols, float* x) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] += bias[i % cols];
  }
}

// Block (32, kBiasGradRowThreads): threadIdx.x picks a column (consecutive threads read
// consecutive floats), threadIdx.y strides over the rows; the partial sums are then added in
// shared memory. Deterministic: no atomics.
constexpr int kBiasGradRowThreads = 8;

__global__ void BiasGradKernel(const float* dy, int rows, int cols, float* dbias) {
  __shared__ float partial[kBiasGradRowThreads][kWarpSize + 1];
  const int col = blockIdx.x * kWarpSize + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int r = threadIdx.y; r < rows; r += kBiasGradRowThreads) {
      sum += dy[int64_t{r} * cols + col];
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int y = 1; y < kBiasGradRowThreads; ++y) sum += partial[y][threadIdx.x];
    dbias[col] = sum;
  }
}

template <Activation F>
__global__ void ActivationForwardKernel(const float* x, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    switch (F) {
      case Activation::kLinear:
        y[i] = v;
        break;
      case Activation::kRelu:
        y[i] = fmaxf(v, 0.0f);
        break;
      case Activation::kSigmoid:
        y[i] = StableSigmoid(v);
        break;
      case Activation::kTanh:
        y[i] = tanhf(v);
        break;
    }
  }
}

template <Activation F>
__global__ void ActivationBackwardKernel(const float* y, const float* dy, int64_t n, float* dx) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = dy[i];
    switch (F) {
      case Activation::kLinear:
        dx[i] = g;
        break;
      case Activation::kRelu:
        dx[i] = y[i] > 0.0f ? g : 0.0f;
        break;
      case Activation::kSigmoid:
        dx[i] = g * y[i] * (1.0f - y[i]);
        break;
      case Activation::kTanh:
        dx[i] = g * (1.0f - y[i] * y[i]);
        break;
    }
  }
}

// One block per row: the row's max, then the sum of exp(x - max), then the outputs.
__global__ void SoftmaxCrossEntropyKernel(const float* logits, const int32_t* labels, int classes,
                                          float inv_rows, float* loss, float* dlogits) {
  __shared__ float scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * classes;
  float* dx = dlogits + row * classes;
  float max = -INFINITY;
  for (int c = threadIdx.x; c < classes; c += blockDim.x) max = fmaxf(max, x[c]);
  max = BlockAllReduce(max, MaxOp(), scratch);
  float sum = 0.0f;
  for (int c = threadIdx.x; c < classes; c += blockDim.x) sum += expf(x[c] - max);
  sum = BlockAllReduce(sum, SumOp(), scratch);
  const int label = labels[row];
  // Matches the CPU backend: an out-of-range label gives a NaN loss and no out-of-bounds read.
  const bool label_ok = label >= 0 && label < classes;
  if (threadIdx.x == 0) loss[row] = label_ok ? logf(sum) - (x[label] - max) : NAN;
  const float inv_sum = 1.0f / sum;
  for (int c = threadIdx.x; c < classes; c += blockDim.x) {
    const float onehot = c == label ? 1.0f : 0.0f;
    dx[c] = (expf(x[c] - max) * inv_sum - onehot) * inv_rows;
  }
}

// True when (v, i) should win over (best_v, best_i): larger, or equal and earlier.
__device__ bool Beats(float v, int i, float best_v, int best_i) {
  return v > best_v || (v == best_v && i < best_i);
}

// One block per row; ties go to the lowest index, as on the CPU.
__global__ void ArgMaxKernel(const float* logits, int classes, int32_t* out) {
  __shared__ float scratch_v[kWarpSize];
  __shared__ int scratch_i[kWarpSize];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * classes;
  float best_v = -INFINITY;
  int best_i = classes;
  for (int c = threadIdx.x; c < classes; c += blockDim.x) {
    if (Beats(x[c], c, best_v, best_i)) {
      best_v = x[c];
      best_i = c;
    }
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float v = __shfl_xor_sync(kFullWarp, best_v, offset);
    const int i = __shfl_xor_sync(kFullWarp, best_i, offset);
    if (Beats(v, i, best_v, best_i)) {
      best_v = v;
      best_i = i;
    }
  }
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) {
    scratch_v[warp] = best_v;
    scratch_i[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < blockDim.x / kWarpSize; ++w) {
      if (Beats(scratch_v[w], scratch_i[w], best_v, best_i)) {
        best_v = scratch_v[w];
        best_i = scratch_i[w];
      }
    }
    // A row of NaNs only: no candidate won; report class 0, as the CPU does.
    out[row] = best_i < classes ? best_i : 0;
  }
}

__global__ void SigmoidCrossEntropyKernel(const float* logits, const float* labels, int rows,
                                          float inv_rows, float* loss, float* dlogits) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x) {
    const float z = logits[i];
    const float y = labels[i];
    loss[i] = fmaxf(z, 0.0f) - z * y + log1pf(expf(-fabsf(z)));
    dlogits[i] = (StableSigmoid(z) - y) * inv_rows;
  }
}

// Block (x: dimensions, y: examples); each thread owns one (example, dimension) at a time, so
// consecutive threads touch consecutive floats of a row.
__global__ void EmbeddingBagForwardKernel(const float* rows, const int32_t* row_index,
                                          const int32_t* offsets, int batch, int dim, bool mean,
                                          int out_stride, int out_col, float* out) {
  const int b = blockIdx.x * blockDim.y + threadIdx.y;
  if (b >= batch) return;
  const int32_t begin = offsets[b];
  const int32_t end = offsets[b + 1];
  const float scale = mean && end > begin ? 1.0f / static_cast<float>(end - begin) : 1.0f;
  float* o = out + int64_t{b} * out_stride + out_col;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int32_t i = begin; i < end; ++i) sum += rows[int64_t{row_index[i]} * dim + d];
    o[d] = sum * scale;
  }
}

// Same layout as the forward pass; rows shared by several examples (or repeated within one)
// are accumulated with atomicAdd.
__global__ void EmbeddingBagBackwardKernel(const float* dout, const int32_t* row_index,
                                           const int32_t* offsets, int batch, int dim, bool mean,
                                           int out_stride, int out_col, float* drows) {
  const int b = blockIdx.x * blockDim.y + threadIdx.y;
  if (b >= batch) return;
  const int32_t begin = offsets[b];
  const int32_t end = offsets[b + 1];
  const float scale = mean && end > begin ? 1.0f / static_cast<float>(end - begin) : 1.0f;
  const float* g = dout + int64_t{b} * out_stride + out_col;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    const float grad = g[d] * scale;
    for (int32_t i = begin; i < end; ++i) {
      atomicAdd(&drows[int64_t{row_index[i]} * dim + d], grad);
    }
  }
}

__global__ void ScaleCopyKernel(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = alpha * x[i];
  }
}

__global__ void AddKernel(int64_t n, const float* a, const float* b, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

// ConvGeometry's size helpers are host functions; these are their device counterparts.
__device__ int64_t InputSize(const ConvGeometry& g) {
  return int64_t{g.batch} * g.height * g.width * g.channels;
}
__device__ int64_t OutputPositions(const ConvGeometry& g) {
  return int64_t{g.batch} * g.out_h * g.out_w;
}
__device__ int64_t PatchSize(const ConvGeometry& g) {
  return int64_t{g.kernel_h} * g.kernel_w * g.channels;
}

// The conv kernels below index with Index: int32_t when every index fits (cheaper division),
// else int64_t.

// Element i of an NHWC tensor [batch, height, width, channels], channels innermost: its
// example, row, column and channel.
template <typename Index>
struct NhwcPosition {
  Index n;
  int h, w, c;
};
template <typename Index>
__device__ NhwcPosition<Index> UnflattenNhwc(Index i, int height, int width, int channels) {
  const int c = static_cast<int>(i % channels);
  const Index q = i / channels;
  const int w = static_cast<int>(q % width);
  const Index r = q / width;
  return {r / height, static_cast<int>(r % height), w, c};
}

// One thread per element of cols [output positions x patch].
template <typename Index>
__global__ void Im2ColKernel(ConvGeometry g, const float* x, float* cols) {
  const Index patch = PatchSize(g);
  const Index n_total = OutputPositions(g) * patch;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index p = i / patch;
    const Index j = i - p * patch;
    const int c = static_cast<int>(j % g.channels);
    const int k = static_cast<int>(j / g.channels);
    const int kw = k % g.kernel_w;
    const int kh = k / g.kernel_w;
    const int ow = static_cast<int>(p % g.out_w);
    const Index q = p / g.out_w;
    const int oh = static_cast<int>(q % g.out_h);
    const Index n = q / g.out_h;
    const int ih = oh * g.stride_h - g.pad_top + kh;
    const int iw = ow * g.stride_w - g.pad_left + kw;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    cols[i] = inside ? x[((n * g.height + ih) * g.width + iw) * g.channels + c] : 0.0f;
  }
}

// Im2ColKernel four channels at a time (channels a multiple of 4, x and cols 16-byte aligned):
// one float4 per thread, the channel quads of a patch position consecutive across threads, so
// that loads and stores are whole 16-byte words and the index arithmetic is done once per four
// elements.
template <typename Index>
__global__ void Im2ColQuadKernel(ConvGeometry g, const float4* x, float4* cols) {
  const int quads = g.channels / 4;
  const Index patch = Index{g.kernel_h} * g.kernel_w * quads;  // in quads
  const Index n_total = OutputPositions(g) * patch;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index p = i / patch;
    const Index j = i - p * patch;
    const int c = static_cast<int>(j % quads);
    const int k = static_cast<int>(j / quads);
    const int kw = k % g.kernel_w;
    const int kh = k / g.kernel_w;
    const int ow = static_cast<int>(p % g.out_w);
    const Index q = p / g.out_w;
    const int oh = static_cast<int>(q % g.out_h);
    const Index n = q / g.out_h;
    const int ih = oh * g.stride_h - g.pad_top + kh;
    const int iw = ow * g.stride_w - g.pad_left + kw;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    cols[i] = inside ? x[((n * g.height + ih) * g.width + iw) * quads + c] : zero;
  }
}

// The first output index o with o * stride - pad + kernel > h (windows starting at or after it
// may cover h), and one past the last with o * stride - pad <= h; clamped to [0, out).
__device__ void CoveringWindows(int h, int stride, int pad, int kernel, int out, int* begin,
                                int* end) {
  const int first = h + pad - kernel + 1;  // o * stride >= first
  *begin = first <= 0 ? 0 : (first + stride - 1) / stride;
  *end = min(out, (h + pad) / stride + 1);
}

// A gather: one thread per element of dx, summing the dcols entries that Im2Col copied from it
// in a fixed order (no atomics).
template <typename Index>
__global__ void Col2ImKernel(ConvGeometry g, const float* dcols, float* dx) {
  const Index patch = PatchSize(g);
  const Index n_total = InputSize(g);
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const auto [n, h, w, c] = UnflattenNhwc(i, g.height, g.width, g.channels);
    int oh_begin, oh_end, ow_begin, ow_end;
    CoveringWindows(h, g.stride_h, g.pad_top, g.kernel_h, g.out_h, &oh_begin, &oh_end);
    CoveringWindows(w, g.stride_w, g.pad_left, g.kernel_w, g.out_w, &ow_begin, &ow_end);
    float sum = 0.0f;
    for (int oh = oh_begin; oh < oh_end; ++oh) {
      const int kh = h + g.pad_top - oh * g.stride_h;
      for (int ow = ow_begin; ow < ow_end; ++ow) {
        const int kw = w + g.pad_left - ow * g.stride_w;
        const Index p = (n * g.out_h + oh) * g.out_w + ow;
        sum += dcols[p * patch + (Index{kh} * g.kernel_w + kw) * g.channels + c];
      }
    }
    dx[i] = sum;
  }
}

// Col2ImKernel four channels at a time (channels a multiple of 4, dcols and dx 16-byte
// aligned): one thread per channel quad of dx, the same sums in the same order.
template <typename Index>
__global__ void Col2ImQuadKernel(ConvGeometry g, const float4* dcols, float4* dx) {
  const int quads = g.channels / 4;
  const Index patch = Index{g.kernel_h} * g.kernel_w * quads;  // in quads
  const Index n_total = InputSize(g) / 4;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const auto [n, h, w, c] = UnflattenNhwc(i, g.height, g.width, quads);
    int oh_begin, oh_end, ow_begin, ow_end;
    CoveringWindows(h, g.stride_h, g.pad_top, g.kernel_h, g.out_h, &oh_begin, &oh_end);
    CoveringWindows(w, g.stride_w, g.pad_left, g.kernel_w, g.out_w, &ow_begin, &ow_end);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int oh = oh_begin; oh < oh_end; ++oh) {
      const int kh = h + g.pad_top - oh * g.stride_h;
      for (int ow = ow_begin; ow < ow_end; ++ow) {
        const int kw = w + g.pad_left - ow * g.stride_w;
        const Index p = (n * g.out_h + oh) * g.out_w + ow;
        const float4 d = dcols[p * patch + (Index{kh} * g.kernel_w + kw) * quads + c];
        sum.x += d.x;
        sum.y += d.y;
        sum.z += d.z;
        sum.w += d.w;
      }
    }
    dx[i] = sum;
  }
}

// One thread per output element; ties keep the first position in window order (the lowest
// flat index), as on the CPU.
template <typename Index>
__global__ void MaxPoolForwardKernel(ConvGeometry g, const float* x, float* y, int32_t* argmax) {
  const Index n_total = OutputPositions(g) * g.channels;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const auto [n, oh, ow, c] = UnflattenNhwc(i, g.out_h, g.out_w, g.channels);
    const int h_begin = max(0, oh * g.stride_h - g.pad_top);
    const int h_end = min(g.height, oh * g.stride_h - g.pad_top + g.kernel_h);
    const int w_begin = max(0, ow * g.stride_w - g.pad_left);
    const int w_end = min(g.width, ow * g.stride_w - g.pad_left + g.kernel_w);
    float best = 0.0f;
    Index best_index = -1;
    for (int ih = h_begin; ih < h_end; ++ih) {
      for (int iw = w_begin; iw < w_end; ++iw) {
        const Index index = ((n * g.height + ih) * g.width + iw) * g.channels + c;
        const float v = x[index];
        if (best_index < 0 || v > best) {
          best = v;
          best_index = index;
        }
      }
    }
    y[i] = best;
    argmax[i] = static_cast<int32_t>(best_index);
  }
}

// A gather: one thread per element of dx, adding dy of the windows covering it whose argmax
// is this element, in output order (no atomics).
template <typename Index>
__global__ void MaxPoolBackwardKernel(ConvGeometry g, const float* dy, const int32_t* argmax,
                                      float* dx) {
  const Index n_total = InputSize(g);
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const auto [n, h, w, c] = UnflattenNhwc(i, g.height, g.width, g.channels);
    int oh_begin, oh_end, ow_begin, ow_end;
    CoveringWindows(h, g.stride_h, g.pad_top, g.kernel_h, g.out_h, &oh_begin, &oh_end);
    CoveringWindows(w, g.stride_w, g.pad_left, g.kernel_w, g.out_w, &ow_begin, &ow_end);
    float sum = 0.0f;
    for (int oh = oh_begin; oh < oh_end; ++oh) {
      for (int ow = ow_begin; ow < ow_end; ++ow) {
        const Index o = ((n * g.out_h + oh) * g.out_w + ow) * g.channels + c;
        if (argmax[o] == i) sum += dy[o];
      }
    }
    dx[i] = sum;
  }
}

// The positions of window (oh, ow) that lie inside the input: [h_begin, h_end) x [w_begin,
// w_end).
__device__ int WindowCount(const ConvGeometry& g, int oh, int ow) {
  const int h_begin = max(0, oh * g.stride_h - g.pad_top);
  const int h_end = min(g.height, oh * g.stride_h - g.pad_top + g.kernel_h);
  const int w_begin = max(0, ow * g.stride_w - g.pad_left);
  const int w_end = min(g.width, ow * g.stride_w - g.pad_left + g.kernel_w);
  return max(h_end - h_begin, 0) * max(w_end - w_begin, 0);
}

// One thread per output element, summing its window in window order (as the CPU does).
template <typename Index>
__global__ void AvgPoolForwardKernel(ConvGeometry g, const float* x, float* y) {
  const Index n_total = OutputPositions(g) * g.channels;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const auto [n, oh, ow, c] = UnflattenNhwc(i, g.out_h, g.out_w, g.channels);
    const int h_begin = max(0, oh * g.stride_h - g.pad_top);
    const int h_end = min(g.height, oh * g.stride_h - g.pad_top + g.kernel_h);
    const int w_begin = max(0, ow * g.stride_w - g.pad_left);
    const int w_end = min(g.width, ow * g.stride_w - g.pad_left + g.kernel_w);
    const int count = WindowCount(g, oh, ow);
    const float scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
    float sum = 0.0f;
    for (int ih = h_begin; ih < h_end; ++ih) {
      for (int iw = w_begin; iw < w_end; ++iw) {
        sum += x[((n * g.height + ih) * g.width + iw) * g.channels + c] * scale;
      }
    }
    y[i] = sum;
  }
}

// A gather: one thread per element of dx, adding each covering window's dy over its count, in
// output order (no atomics).
template <typename Index>
__global__ void AvgPoolBackwardKernel(ConvGeometry g, const float* dy, float* dx) {
  const Index n_total = InputSize(g);
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const auto [n, h, w, c] = UnflattenNhwc(i, g.height, g.width, g.channels);
    int oh_begin, oh_end, ow_begin, ow_end;
    CoveringWindows(h, g.stride_h, g.pad_top, g.kernel_h, g.out_h, &oh_begin, &oh_end);
    CoveringWindows(w, g.stride_w, g.pad_left, g.kernel_w, g.out_w, &ow_begin, &ow_end);
    float sum = 0.0f;
    for (int oh = oh_begin; oh < oh_end; ++oh) {
      for (int ow = ow_begin; ow < ow_end; ++ow) {
        const Index o = ((n * g.out_h + oh) * g.out_w + ow) * g.channels + c;
        sum += dy[o] * (1.0f / static_cast<float>(WindowCount(g, oh, ow)));
      }
    }
    dx[i] = sum;
  }
}

// One thread per (example, channel): consecutive threads read consecutive channels.
__global__ void GlobalAvgPoolForwardKernel(const float* x, int batch, int positions, int channels,
                                           float* y) {
  const int64_t n_total = int64_t{batch} * channels;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / channels;
    const int c = static_cast<int>(i - n * channels);
    const float* v = x + n * positions * channels + c;
    float sum = 0.0f;
    for (int p = 0; p < positions; ++p) sum += v[int64_t{p} * channels];
    y[i] = positions > 0 ? sum / static_cast<float>(positions) : 0.0f;
  }
}

__global__ void GlobalAvgPoolBackwardKernel(const float* dy, int positions, int channels,
                                            int64_t n_total, float scale, float* dx) {
  const int64_t per_example = int64_t{positions} * channels;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / per_example;
    const int c = static_cast<int>(i % channels);
    dx[i] = dy[n * channels + c] * scale;
  }
}

// The batch-norm elementwise kernels keep per-channel constants in (dynamic) shared memory when
// there are at most this many channels, and compute them per element otherwise. The channel of
// element i (i % channels) is tracked incrementally along the grid-stride loop rather than divided
// out each time.
constexpr int kMaxSharedChannels = 1024;

// y = (x - mean) * gamma / sqrt(variance + epsilon) + beta.
__global__ void BatchNormApplyKernel(const float* x, int64_t n_total, int channels,
                                     const float* gamma, const float* beta, const float* mean,
                                     const float* variance, float epsilon, float* y) {
  extern __shared__ float constants[];  // [scale, mean, beta][channels] when cached
  const bool cached = channels <= kMaxSharedChannels;
  float* const s_scale = constants;
  float* const s_mean = constants + channels;
  float* const s_beta = constants + 2 * channels;
  if (cached) {
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
      s_scale[c] = gamma[c] / sqrtf(variance[c] + epsilon);
      s_mean[c] = mean[c];
      s_beta[c] = beta[c];
    }
    __syncthreads();
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int c_step = static_cast<int>(stride % channels);
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int c = static_cast<int>(i % channels); i < n_total; i += stride) {
    if (cached) {
      y[i] = (x[i] - s_mean[c]) * s_scale[c] + s_beta[c];
    } else {
      const float scale = gamma[c] / sqrtf(variance[c] + epsilon);
      y[i] = (x[i] - mean[c]) * scale + beta[c];
    }
    c += c_step;
    if (c >= channels) c -= channels;
  }
}

// dx = gamma / sqrt(variance + epsilon) * (dy - (dbeta + xhat * dgamma) / rows); dx may alias
// dy (each element is read before it is written, by the same thread).
__global__ void BatchNormBackwardDxKernel(const float* x, const float* dy, int64_t n_total,
                                          int channels, float inv_rows, const float* gamma,
                                          const float* mean, const float* variance, float epsilon,
                                          const float* dgamma, const float* dbeta, float* dx) {
  // [inv_std, scale, mean, mean dy, mean dy * xhat][channels] when cached.
  extern __shared__ float constants[];
  const bool cached = channels <= kMaxSharedChannels;
  float* const s_inv_std = constants;
  float* const s_scale = constants + channels;
  float* const s_mean = constants + 2 * channels;
  float* const s_mean_dy = constants + 3 * channels;
  float* const s_mean_dy_xhat = constants + 4 * channels;
  if (cached) {
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
      const float inv_std = 1.0f / sqrtf(variance[c] + epsilon);
      s_inv_std[c] = inv_std;
      s_scale[c] = gamma[c] * inv_std;
      s_mean[c] = mean[c];
      s_mean_dy[c] = dbeta[c] * inv_rows;
      s_mean_dy_xhat[c] = dgamma[c] * inv_rows;
    }
    __syncthreads();
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int c_step = static_cast<int>(stride % channels);
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int c = static_cast<int>(i % channels); i < n_total; i += stride) {
    if (cached) {
      const float xhat = (x[i] - s_mean[c]) * s_inv_std[c];
      dx[i] = s_scale[c] * (dy[i] - s_mean_dy[c] - xhat * s_mean_dy_xhat[c]);
    } else {
      const float inv_std = 1.0f / sqrtf(variance[c] + epsilon);
      const float xhat = (x[i] - mean[c]) * inv_std;
      dx[i] = gamma[c] * inv_std * (dy[i] - dbeta[c] * inv_rows - xhat * (dgamma[c] * inv_rows));
    }
    c += c_step;
    if (c >= channels) c -= channels;
  }
}

// ---- Column sums of a tall [rows x cols] matrix, in two deterministic passes ----
//
// Pass 1: each block of kReduceThreads threads covers a tile of up to kReduceThreads columns
// and strides over the rows; its threads sit on rows_per_step consecutive rows of the tile, so
// that one step reads a contiguous stretch of memory. The block's per-column sums (in a fixed
// order) go to partials[block][value][col]. Pass 2: one block per (value, column) adds the
// blocks' partial sums in a fixed tree order, in double. The number of blocks depends only on
// the shape and the device, so the result is the same on every run.
constexpr int kReduceThreads = 256;
constexpr int kFinalThreads = 128;  // A power of two: pass 2's tree.
// Each pass-1 block covers at least this many steps (rows_per_step rows each).
constexpr int kMinStepsPerBlock = 16;
// BiasGrad switches to the two-pass reduction from this many rows on.
constexpr int kTwoPassMinRows = 1024;

// The value of element i (column c) to sum: x.
struct LoadValue {
  static constexpr int kValues = 1;
  const float* x;
  __device__ void operator()(int64_t i, int c, float* v) const { v[0] = x[i]; }
};

// (x - mean)^2: the variance's numerator.
struct LoadSquaredDeviation {
  static constexpr int kValues = 1;
  const float* x;
  const float* mean;
  __device__ void operator()(int64_t i, int c, float* v) const {
    const float d = x[i] - mean[c];
    v[0] = d * d;
  }
};

// dy and dy * xhat: batch norm's dbeta and dgamma.
struct LoadBatchNormGrad {
  static constexpr int kValues = 2;
  const float* x;
  const float* dy;
  const float* mean;
  const float* variance;
  float epsilon;
  __device__ void operator()(int64_t i, int c, float* v) const {
    const float inv_std = 1.0f / sqrtf(variance[c] + epsilon);
    const float g = dy[i];
    v[0] = g;
    v[1] = g * ((x[i] - mean[c]) * inv_std);
  }
};

template <typename Load>
__global__ void ColumnPartialSumsKernel(Load load, int64_t rows, int cols, float* partials) {
  constexpr int kValues = Load::kValues;
  __shared__ float shared[kValues][kReduceThreads];
  const int tile_cols = min(cols, kReduceThreads);
  const int rows_per_step = kReduceThreads / tile_cols;
  const int col_in_tile = threadIdx.x % tile_cols;
  const int row_in_step = threadIdx.x / tile_cols;
  const int col = blockIdx.y * tile_cols + col_in_tile;
  float sum[kValues];
  for (int k = 0; k < kValues; ++k) sum[k] = 0.0f;
  if (row_in_step < rows_per_step && col < cols) {
    const int64_t step = int64_t{gridDim.x} * rows_per_step;
    for (int64_t r = int64_t{blockIdx.x} * rows_per_step + row_in_step; r < rows; r += step) {
      float v[kValues];
      load(r * cols + col, col, v);
      for (int k = 0; k < kValues; ++k) sum[k] += v[k];
    }
  }
  for (int k = 0; k < kValues; ++k) shared[k][threadIdx.x] = sum[k];
  __syncthreads();
  if (threadIdx.x < tile_cols && col < cols) {
    for (int k = 0; k < kValues; ++k) {
      float total = shared[k][threadIdx.x];
      for (int j = 1; j < rows_per_step; ++j) total += shared[k][j * tile_cols + threadIdx.x];
      partials[(int64_t{blockIdx.x} * kValues + k) * cols + col] = total;
    }
  }
}

// Block b = value * cols + col: out_value[col] = scale * the sum of partials[*][value][col].
__global__ void ColumnFinalSumsKernel(const float* partials, int blocks, int cols, int values,
                                      double scale, float* out0, float* out1) {
  __shared__ double shared[kFinalThreads];
  const int k = blockIdx.x / cols;
  const int c = blockIdx.x % cols;
  double sum = 0.0;
  for (int b = threadIdx.x; b < blocks; b += kFinalThreads) {
    sum += partials[(int64_t{b} * values + k) * cols + c];
  }
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int s = kFinalThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) (k == 0 ? out0 : out1)[c] = static_cast<float>(shared[0] * scale);
}

// Thread-compatible, like every Kernels. Each call makes the object's device current first, so
// the object may move between threads (cudaSetDevice is per host thread).
class CudaKernels final : public Kernels {
 public:
  CudaKernels(int device, std::string device_name, int64_t memory_limit_bytes)
      : device_(device),
        name_(absl::StrCat("cuda:", device, " (", device_name, ")")),
        memory_limit_bytes_(memory_limit_bytes) {}

  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  // Frees what the caller did not. Only logs on failure: the process may already be going
  // down for a device error.
  ~CudaKernels() override {
    LogIfError(cudaSetDevice(device_), "cudaSetDevice");
    for (cudaStream_t s : {stream_, upload_stream_, download_stream_}) {
      if (s != nullptr) LogIfError(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    }
    for (const auto& [p, bytes] : allocations_) LogIfError(cudaFree(p), "cudaFree");
    if (scratch_ != nullptr) LogIfError(cudaFree(scratch_), "cudaFree");
    for (float* p : retired_scratch_) LogIfError(cudaFree(p), "cudaFree");
    {
      absl::MutexLock lock(&host_mu_);
      for (void* p : host_allocations_) LogIfError(cudaFreeHost(p), "cudaFreeHost");
    }
    if (cublas_ != nullptr) {
      const cublasStatus_t s = cublasDestroy(cublas_);
      if (s != CUBLAS_STATUS_SUCCESS) {
        LOG(ERROR) << "cublasDestroy failed: " << cublasGetStatusString(s);
      }
    }
    if (cublas_workspace_ != nullptr) LogIfError(cudaFree(cublas_workspace_), "cudaFree");
    for (cudaStream_t s : {stream_, upload_stream_, download_stream_}) {
      if (s != nullptr) LogIfError(cudaStreamDestroy(s), "cudaStreamDestroy");
    }
  }

  // Creates the stream and the cuBLAS handle. Called once, by NewCudaKernels.
  absl::Status Init() {
    cudaError_t err = cudaSetDevice(device_);
    if (err != cudaSuccess) return DeviceError("cudaSetDevice", err);
    err = cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, device_);
    if (err != cudaSuccess) return DeviceError("cudaDeviceGetAttribute", err);
    // Non-blocking: no implicit synchronization with other libraries' work on the legacy
    // default stream.
    for (cudaStream_t* s : {&stream_, &upload_stream_, &download_stream_}) {
      err = cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
      if (err != cudaSuccess) return DeviceError("cudaStreamCreateWithFlags", err);
    }
    cublasStatus_t s = cublasCreate(&cublas_);
    if (s != CUBLAS_STATUS_SUCCESS) return CublasError("cublasCreate", s);
    s = cublasSetStream(cublas_, stream_);
    if (s != CUBLAS_STATUS_SUCCESS) return CublasError("cublasSetStream", s);
    // Full FP32 products: no TF32 tensor cores, whose 10-bit mantissa would make the CUDA
    // gradients differ visibly from the CPU ones (cuBLAS's default, stated to be sure).
    s = cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH);
    if (s != CUBLAS_STATUS_SUCCESS) return CublasError("cublasSetMathMode", s);
    // A workspace of our own (cuBLAS's advice for Hopper: 32 MiB), so that a product captured
    // in a graph (BeginCapture) records this buffer instead of allocating one per capture.
    constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
    err = cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes);
    if (err != cudaSuccess) return DeviceError("cudaMalloc of cuBLAS's workspace", err);
    s = cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes);
    if (s != CUBLAS_STATUS_SUCCESS) return CublasError("cublasSetWorkspace", s);
    // The reductions' partial sums: ColumnSums uses at most multiprocessors * 8 row blocks of
    // kReduceThreads columns and two values each, below 272,000 columns (2.2 MB on an H100).
    // Allocated here so that a device without room fails now, with a status, rather than in a
    // step; like cuBLAS's workspace, it is the backend's own and not counted in
    // memory_limit_bytes.
    const int64_t floats = int64_t{multiprocessors_} * 8 * kReduceThreads * 2;
    void* scratch = nullptr;
    err = cudaMalloc(&scratch, static_cast<size_t>(floats) * sizeof(float));
    if (err != cudaSuccess) return DeviceError("cudaMalloc of the reduction workspace", err);
    scratch_ = static_cast<float*>(scratch);
    scratch_floats_ = floats;
    return absl::OkStatus();
  }

  std::string name() const override { return name_; }

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

  // cudaFree waits for the device, so work still reading p finishes first.
  void Free(void* p) override {
    if (p == nullptr) return;
    auto it = allocations_.find(p);
    CHECK(it != allocations_.end()) << "Free(" << p << "): not allocated by " << name_;
    MakeCurrent();
    PS_CUDA_CHECK(cudaFree(p));
    bytes_in_use_ -= it->second;
    allocations_.erase(it);
  }

  // The host buffer may be reused as soon as these return: from pageable memory (std::vector,
  // new[]) cudaMemcpyAsync stages the data before returning.
  void CopyToDevice(const float* host, float* device, int64_t n) override {
    CopyAsync(device, host, n * sizeof(float), cudaMemcpyHostToDevice);
  }
  void CopyToDevice(const int32_t* host, int32_t* device, int64_t n) override {
    CopyAsync(device, host, n * sizeof(int32_t), cudaMemcpyHostToDevice);
  }

  void CopyToHost(const float* device, float* host, int64_t n) override {
    CopyAsync(host, device, n * sizeof(float), cudaMemcpyDeviceToHost);
    PS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void CopyToHostInts(const int32_t* device, int32_t* host, int64_t n) override {
    CopyAsync(host, device, n * sizeof(int32_t), cudaMemcpyDeviceToHost);
    PS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // cuBLAS is column-major. A row-major [r x c] matrix is, read column-major, its transpose
  // [c x r] with leading dimension c. So C (row-major [m x n]) is computed as the column-major
  // C^T = op(B)^T * op(A)^T: cuBLAS's first operand is b, its second a, with m and n swapped.
  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    if (m <= 0 || n <= 0) return;
    MakeCurrent();
    if (k <= 0) {
      // Nothing to multiply: c = beta * c, which cuBLAS is not asked to special-case.
      if (beta == 0.0f) {
        Fill(c, int64_t{m} * n, 0.0f);
      } else if (beta != 1.0f) {
        ScaleKernel<<<Blocks(int64_t{m} * n), kThreadsPerBlock, 0, stream_>>>(c, int64_t{m} * n,
                                                                              beta);
        PS_CUDA_CHECK_LAUNCH("ScaleKernel");
      }
      return;
    }
    const int lda = trans_a ? m : k;  // row length of a as stored
    const int ldb = trans_b ? k : n;
    PS_CUBLAS_CHECK(cublasSgemm(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a,
                                lda, &beta, c, n));
  }

  void AddBias(const float* bias, int rows, int cols, float* x) override {
    const int64_t n = int64_t{rows} * cols;
    if (rows <= 0 || cols <= 0) return;
    MakeCurrent();
    AddBiasKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(bias, n, cols, x);
    PS_CUDA_CHECK_LAUNCH("AddBiasKernel");
  }

  void BiasGrad(const float* dy, int rows, int cols, float* dbias) override {
    if (cols <= 0) return;
    MakeCurrent();
    if (rows >= kTwoPassMinRows) {
      // Tall and skinny (a convolution's output): one block per 32 columns would leave most of
      // the device idle, so spread the rows over many blocks.
      ColumnSums(LoadValue{dy}, rows, cols, 1.0, dbias, nullptr);
      return;
    }
    const dim3 block(kWarpSize, kBiasGradRowThreads);
    const int grid = (cols + kWarpSize - 1) / kWarpSize;
    BiasGradKernel<<<grid, block, 0, stream_>>>(dy, std::max(rows, 0), cols, dbias);
    PS_CUDA_CHECK_LAUNCH("BiasGradKernel");
  }

  void ActivationForward(Activation f, const float* x, int64_t n, float* y) override {
    if (n <= 0) return;
    if (f == Activation::kLinear && x == y) return;
    MakeCurrent();
    switch (f) {
      case Activation::kLinear:
        LaunchActivationForward<Activation::kLinear>(x, n, y);
        return;
      case Activation::kRelu:
        LaunchActivationForward<Activation::kRelu>(x, n, y);
        return;
      case Activation::kSigmoid:
        LaunchActivationForward<Activation::kSigmoid>(x, n, y);
        return;
      case Activation::kTanh:
        LaunchActivationForward<Activation::kTanh>(x, n, y);
        return;
    }
    LOG(FATAL) << "unknown activation " << static_cast<int>(f);
  }

  void ActivationBackward(Activation f, const float* y, const float* dy, int64_t n,
                          float* dx) override {
    if (n <= 0) return;
    if (f == Activation::kLinear && dy == dx) return;
    MakeCurrent();
    switch (f) {
      case Activation::kLinear:
        LaunchActivationBackward<Activation::kLinear>(y, dy, n, dx);
        return;
      case Activation::kRelu:
        LaunchActivationBackward<Activation::kRelu>(y, dy, n, dx);
        return;
      case Activation::kSigmoid:
        LaunchActivationBackward<Activation::kSigmoid>(y, dy, n, dx);
        return;
      case Activation::kTanh:
        LaunchActivationBackward<Activation::kTanh>(y, dy, n, dx);
        return;
    }
    LOG(FATAL) << "unknown activation " << static_cast<int>(f);
  }

  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int classes,
                           float* loss, float* dlogits) override {
    if (rows <= 0 || classes <= 0) return;
    MakeCurrent();
    SoftmaxCrossEntropyKernel<<<rows, RowThreads(classes), 0, stream_>>>(
        logits, labels, classes, 1.0f / static_cast<float>(rows), loss, dlogits);
    PS_CUDA_CHECK_LAUNCH("SoftmaxCrossEntropyKernel");
  }

  void ArgMax(const float* logits, int rows, int classes, int32_t* out) override {
    if (rows <= 0 || classes <= 0) return;
    MakeCurrent();
    ArgMaxKernel<<<rows, RowThreads(classes), 0, stream_>>>(logits, classes, out);
    PS_CUDA_CHECK_LAUNCH("ArgMaxKernel");
  }

  void SigmoidCrossEntropy(const float* logits, const float* labels, int rows, float* loss,
                           float* dlogits) override {
    if (rows <= 0) return;
    MakeCurrent();
    SigmoidCrossEntropyKernel<<<Blocks(rows), kThreadsPerBlock, 0, stream_>>>(
        logits, labels, rows, 1.0f / static_cast<float>(rows), loss, dlogits);
    PS_CUDA_CHECK_LAUNCH("SigmoidCrossEntropyKernel");
  }

  void EmbeddingBagForward(const float* rows, const int32_t* row_index, const int32_t* offsets,
                           int batch, int dim, bool mean, int out_stride, int out_col,
                           float* out) override {
    if (batch <= 0 || dim <= 0) return;
    MakeCurrent();
    const dim3 block = EmbeddingBlock(dim);
    const int grid = (batch + block.y - 1) / block.y;
    EmbeddingBagForwardKernel<<<grid, block, 0, stream_>>>(rows, row_index, offsets, batch, dim,
                                                           mean, out_stride, out_col, out);
    PS_CUDA_CHECK_LAUNCH("EmbeddingBagForwardKernel");
  }

  void EmbeddingBagBackward(const float* dout, const int32_t* row_index, const int32_t* offsets,
                            int batch, int dim, bool mean, int out_stride, int out_col,
                            float* drows) override {
    if (batch <= 0 || dim <= 0) return;
    MakeCurrent();
    const dim3 block = EmbeddingBlock(dim);
    const int grid = (batch + block.y - 1) / block.y;
    EmbeddingBagBackwardKernel<<<grid, block, 0, stream_>>>(dout, row_index, offsets, batch, dim,
                                                            mean, out_stride, out_col, drows);
    PS_CUDA_CHECK_LAUNCH("EmbeddingBagBackwardKernel");
  }

  void Axpy(int64_t n, float alpha, const float* x, float* y) override {
    if (n <= 0) return;
    MakeCurrent();
    AxpyKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(n, alpha, x, y);
    PS_CUDA_CHECK_LAUNCH("AxpyKernel");
  }

  void GatherRows(const void* table, const int32_t* index, int n, int64_t row, void* out) override {
    const int64_t total = int64_t{n} * row;
    if (total <= 0) return;
    MakeCurrent();
    GatherRowsKernel<<<Blocks(total), kThreadsPerBlock, 0, stream_>>>(
        static_cast<const uint32_t*>(table), index, total, row, static_cast<uint32_t*>(out));
    PS_CUDA_CHECK_LAUNCH("GatherRowsKernel");
  }

  void ApplyUpdate(const ElementwiseUpdate& u, int64_t n, const float* grad, float* var,
                   float* slot0, float* slot1) override {
    if (n <= 0) return;
    MakeCurrent();
    using Kind = ElementwiseUpdate::Kind;
    switch (u.kind) {
      case Kind::kSgd:
        SgdUpdateKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(n, u.lr, grad, var);
        PS_CUDA_CHECK_LAUNCH("SgdUpdateKernel");
        return;
      case Kind::kMomentum:
        MomentumUpdateKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(
            n, u.lr, u.momentum, u.nesterov, grad, var, slot0);
        PS_CUDA_CHECK_LAUNCH("MomentumUpdateKernel");
        return;
      case Kind::kAdam:
        AdamUpdateKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(
            n, u.lr, 1.0f - u.beta1, 1.0f - u.beta2, u.epsilon, grad, var, slot0, slot1);
        PS_CUDA_CHECK_LAUNCH("AdamUpdateKernel");
        return;
      case Kind::kMovingAverage:
        MovingAverageUpdateKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(n, 1.0f - u.momentum,
                                                                               grad, var);
        PS_CUDA_CHECK_LAUNCH("MovingAverageUpdateKernel");
        return;
    }
  }

  void Fill(float* x, int64_t n, float value) override {
    if (n <= 0) return;
    MakeCurrent();
    FillKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(x, n, value);
    PS_CUDA_CHECK_LAUNCH("FillKernel");
  }

  void Scale(int64_t n, float alpha, float* y) override {
    if (n <= 0) return;
    MakeCurrent();
    ScaleKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(y, n, alpha);
    PS_CUDA_CHECK_LAUNCH("ScaleKernel");
  }

  void ScaleCopy(int64_t n, float alpha, const float* x, float* y) override {
    if (n <= 0) return;
    if (alpha == 1.0f) {
      if (x != y) CopyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice);
      return;
    }
    MakeCurrent();
    ScaleCopyKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(n, alpha, x, y);
    PS_CUDA_CHECK_LAUNCH("ScaleCopyKernel");
  }

  void Add(int64_t n, const float* a, const float* b, float* out) override {
    if (n <= 0) return;
    MakeCurrent();
    AddKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(n, a, b, out);
    PS_CUDA_CHECK_LAUNCH("AddKernel");
  }

  void Im2Col(const ConvGeometry& g, const float* x, float* cols) override {
    const int64_t n = g.output_positions() * g.patch_size();
    if (n <= 0) return;
    MakeCurrent();
    if (Quads(g, x, cols)) {
      const auto* in = reinterpret_cast<const float4*>(x);
      auto* out = reinterpret_cast<float4*>(cols);
      WithIndexType(g, "Im2ColQuadKernel", [&](auto index) {
        Im2ColQuadKernel<decltype(index)>
            <<<Blocks(n / 4), kThreadsPerBlock, 0, stream_>>>(g, in, out);
      });
      return;
    }
    WithIndexType(g, "Im2ColKernel", [&](auto index) {
      Im2ColKernel<decltype(index)><<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(g, x, cols);
    });
  }

  void Col2Im(const ConvGeometry& g, const float* dcols, float* dx) override {
    const int64_t n = g.input_size();
    if (n <= 0) return;
    MakeCurrent();
    if (Quads(g, dcols, dx)) {
      const auto* in = reinterpret_cast<const float4*>(dcols);
      auto* out = reinterpret_cast<float4*>(dx);
      WithIndexType(g, "Col2ImQuadKernel", [&](auto index) {
        Col2ImQuadKernel<decltype(index)>
            <<<Blocks(n / 4), kThreadsPerBlock, 0, stream_>>>(g, in, out);
      });
      return;
    }
    WithIndexType(g, "Col2ImKernel", [&](auto index) {
      Col2ImKernel<decltype(index)><<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(g, dcols, dx);
    });
  }

  void MaxPoolForward(const ConvGeometry& g, const float* x, float* y, int32_t* argmax) override {
    const int64_t n = g.output_positions() * g.channels;
    if (n <= 0) return;
    MakeCurrent();
    WithIndexType(g, "MaxPoolForwardKernel", [&](auto index) {
      MaxPoolForwardKernel<decltype(index)>
          <<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(g, x, y, argmax);
    });
  }

  void MaxPoolBackward(const ConvGeometry& g, const float* dy, const int32_t* argmax,
                       float* dx) override {
    const int64_t n = g.input_size();
    if (n <= 0) return;
    MakeCurrent();
    WithIndexType(g, "MaxPoolBackwardKernel", [&](auto index) {
      MaxPoolBackwardKernel<decltype(index)>
          <<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(g, dy, argmax, dx);
    });
  }

  void AvgPoolForward(const ConvGeometry& g, const float* x, float* y) override {
    const int64_t n = g.output_positions() * g.channels;
    if (n <= 0) return;
    MakeCurrent();
    WithIndexType(g, "AvgPoolForwardKernel", [&](auto index) {
      AvgPoolForwardKernel<decltype(index)><<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(g, x, y);
    });
  }

  void AvgPoolBackward(const ConvGeometry& g, const float* dy, float* dx) override {
    const int64_t n = g.input_size();
    if (n <= 0) return;
    MakeCurrent();
    WithIndexType(g, "AvgPoolBackwardKernel", [&](auto index) {
      AvgPoolBackwardKernel<decltype(index)>
          <<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(g, dy, dx);
    });
  }

  void GlobalAvgPoolForward(const float* x, int batch, int positions, int channels,
                            float* y) override {
    const int64_t n = int64_t{batch} * channels;
    if (batch <= 0 || channels <= 0) return;
    MakeCurrent();
    GlobalAvgPoolForwardKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(x, batch, positions,
                                                                            channels, y);
    PS_CUDA_CHECK_LAUNCH("GlobalAvgPoolForwardKernel");
  }

  void GlobalAvgPoolBackward(const float* dy, int batch, int positions, int channels,
                             float* dx) override {
    const int64_t n = int64_t{batch} * positions * channels;
    if (batch <= 0 || positions <= 0 || channels <= 0) return;
    MakeCurrent();
    GlobalAvgPoolBackwardKernel<<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(
        dy, positions, channels, n, 1.0f / static_cast<float>(positions), dx);
    PS_CUDA_CHECK_LAUNCH("GlobalAvgPoolBackwardKernel");
  }

  void BatchNormForwardTraining(const float* x, int64_t rows, int channels, const float* gamma,
                                const float* beta, float epsilon, float* y, float* mean,
                                float* variance) override {
    if (channels <= 0) return;
    if (rows <= 0) {
      Fill(mean, channels, 0.0f);
      Fill(variance, channels, 0.0f);
      return;
    }
    MakeCurrent();
    const double inv_rows = 1.0 / static_cast<double>(rows);
    // The mean first, then the squared deviations from it (no E[x^2] - E[x]^2 cancellation).
    ColumnSums(LoadValue{x}, rows, channels, inv_rows, mean, nullptr);
    ColumnSums(LoadSquaredDeviation{x, mean}, rows, channels, inv_rows, variance, nullptr);
    BatchNormForwardInference(x, rows, channels, gamma, beta, mean, variance, epsilon, y);
  }

  void BatchNormForwardInference(const float* x, int64_t rows, int channels, const float* gamma,
                                 const float* beta, const float* mean, const float* variance,
                                 float epsilon, float* y) override {
    const int64_t n = rows * channels;
    if (rows <= 0 || channels <= 0) return;
    MakeCurrent();
    const size_t shared = channels <= kMaxSharedChannels ? 3 * channels * sizeof(float) : 0;
    BatchNormApplyKernel<<<Blocks(n), kThreadsPerBlock, shared, stream_>>>(
        x, n, channels, gamma, beta, mean, variance, epsilon, y);
    PS_CUDA_CHECK_LAUNCH("BatchNormApplyKernel");
  }

  void BatchNormBackward(const float* x, const float* dy, int64_t rows, int channels,
                         const float* gamma, const float* mean, const float* variance,
                         float epsilon, float* dgamma, float* dbeta, float* dx) override {
    if (channels <= 0) return;
    if (rows <= 0) {
      Fill(dgamma, channels, 0.0f);
      Fill(dbeta, channels, 0.0f);
      return;
    }
    MakeCurrent();
    // One reduction pass for both sums, then the elementwise pass.
    ColumnSums(LoadBatchNormGrad{x, dy, mean, variance, epsilon}, rows, channels, 1.0, dbeta,
               dgamma);
    const int64_t n = rows * channels;
    const size_t shared = channels <= kMaxSharedChannels ? 5 * channels * sizeof(float) : 0;
    BatchNormBackwardDxKernel<<<Blocks(n), kThreadsPerBlock, shared, stream_>>>(
        x, dy, n, channels, 1.0f / static_cast<float>(rows), gamma, mean, variance, epsilon, dgamma,
        dbeta, dx);
    PS_CUDA_CHECK_LAUNCH("BatchNormBackwardDxKernel");
  }

  bool device_is_host() const override { return false; }

  // Page-locked and portable (usable with every device's streams: towers share buffers).
  absl::StatusOr<void*> AllocateHost(int64_t bytes) override {
    MakeCurrent();
    void* p = nullptr;
    const cudaError_t err =
        cudaHostAlloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), cudaHostAllocPortable);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(name_, ": cudaHostAlloc of ", bytes,
                                                       " bytes failed: ", cudaGetErrorString(err)));
    }
    absl::MutexLock lock(&host_mu_);
    host_allocations_.insert(p);
    return p;
  }

  void FreeHost(void* p) override {
    if (p == nullptr) return;
    {
      absl::MutexLock lock(&host_mu_);
      CHECK(host_allocations_.erase(p) == 1) << "FreeHost(" << p << "): not from " << name_;
    }
    MakeCurrent();
    PS_CUDA_CHECK(cudaFreeHost(p));
  }

  void CopyToDeviceAsync(Stream stream, const void* host, void* device, int64_t bytes) override {
    if (bytes <= 0) return;
    MakeCurrent();
    PS_CUDA_CHECK(cudaMemcpyAsync(device, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                  StreamOf(stream)));
  }

  void CopyToHostAsync(Stream stream, const void* device, void* host, int64_t bytes) override {
    if (bytes <= 0) return;
    MakeCurrent();
    PS_CUDA_CHECK(cudaMemcpyAsync(host, device, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                  StreamOf(stream)));
  }

  void CopyRowsToDeviceAsync(Stream stream, const void* host, int64_t host_pitch, void* device,
                             int64_t device_pitch, int64_t row_bytes, int64_t rows) override {
    if (rows <= 0 || row_bytes <= 0) return;
    MakeCurrent();
    PS_CUDA_CHECK(cudaMemcpy2DAsync(device, static_cast<size_t>(device_pitch), host,
                                    static_cast<size_t>(host_pitch), static_cast<size_t>(row_bytes),
                                    static_cast<size_t>(rows), cudaMemcpyHostToDevice,
                                    StreamOf(stream)));
  }

  std::unique_ptr<Event> NewEvent() override {
    MakeCurrent();
    auto e = std::make_unique<CudaEvent>();
    PS_CUDA_CHECK(cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming));
    return e;
  }

  void Record(Event* event, Stream stream) override {
    MakeCurrent();
    PS_CUDA_CHECK(cudaEventRecord(static_cast<CudaEvent*>(event)->event, StreamOf(stream)));
  }

  void Wait(Stream stream, Event* event) override {
    MakeCurrent();
    PS_CUDA_CHECK(cudaStreamWaitEvent(StreamOf(stream), static_cast<CudaEvent*>(event)->event, 0));
  }

  void Synchronize(Event* event) override {
    MakeCurrent();
    PS_CUDA_CHECK(cudaEventSynchronize(static_cast<CudaEvent*>(event)->event));
  }

  MemoryInfo DeviceMemory() override {
    MemoryInfo info;
    size_t free_bytes = 0, total_bytes = 0;
    // On the calling thread (a metrics scrape): its current device, then the query.
    if (cudaSetDevice(device_) == cudaSuccess &&
        cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      info.total_bytes = static_cast<int64_t>(total_bytes);
      info.used_bytes = static_cast<int64_t>(total_bytes - free_bytes);
    }
    return info;
  }

  bool can_capture() const override { return true; }

  // Thread-local capture: the other threads of the process (a pull thread uploading
  // parameters, waiting on events) go on as usual meanwhile.
  absl::Status BeginCapture() override {
    MakeCurrent();
    const cudaError_t err = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) return DeviceError("cudaStreamBeginCapture", err);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override {
    MakeCurrent();
    cudaGraph_t graph = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    if (err != cudaSuccess) {
      cudaGetLastError();  // an invalidated capture is not the next launch's error
      return absl::InternalError(absl::StrCat(
          name_, ": the capture failed (cudaStreamEndCapture: ", cudaGetErrorString(err), ")"));
    }
    auto g = std::make_unique<CudaGraph>();
    err = cudaGraphInstantiate(&g->exec, graph, 0);
    LogIfError(cudaGraphDestroy(graph), "cudaGraphDestroy");
    if (err != cudaSuccess) {
      cudaGetLastError();
      g->exec = nullptr;
      return absl::InternalError(
          absl::StrCat(name_, ": cudaGraphInstantiate failed: ", cudaGetErrorString(err)));
    }
    return std::unique_ptr<Graph>(std::move(g));
  }

  void Launch(Graph* graph) override {
    MakeCurrent();
    PS_CUDA_CHECK(cudaGraphLaunch(static_cast<CudaGraph*>(graph)->exec, stream_));
  }

  int device() const { return device_; }
  cudaStream_t compute_stream() const { return stream_; }

 private:
  struct CudaGraph final : Graph {
    ~CudaGraph() override {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
    cudaGraphExec_t exec = nullptr;
  };

  struct CudaEvent final : Event {
    ~CudaEvent() override {
      if (event != nullptr) cudaEventDestroy(event);
    }
    cudaEvent_t event = nullptr;
  };

  cudaStream_t StreamOf(Stream s) const {
    switch (s) {
      case Stream::kUpload:
        return upload_stream_;
      case Stream::kDownload:
        return download_stream_;
      case Stream::kCompute:
        break;
    }
    return stream_;
  }

  static void LogIfError(cudaError_t err, const char* call) {
    if (err != cudaSuccess) LOG(ERROR) << call << " failed: " << cudaGetErrorString(err);
  }

  absl::Status DeviceError(const char* call, cudaError_t err) const {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot use GPU ", device_, ": ", call, ": ", cudaGetErrorString(err)));
  }
  absl::Status CublasError(const char* call, cublasStatus_t s) const {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot use GPU ", device_, ": ", call, ": ", cublasGetStatusString(s)));
  }

  void MakeCurrent() const { PS_CUDA_CHECK(cudaSetDevice(device_)); }

  // Grid for a grid-stride loop over n elements: enough blocks to fill the device, no more.
  int Blocks(int64_t n) const {
    const int64_t needed = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
    return static_cast<int>(std::min<int64_t>(needed, int64_t{multiprocessors_} * 16));
  }

  // Whether Im2Col and Col2Im on g may move four channels at a time: the channels a multiple of
  // four and both buffers 16-byte aligned (a patch position's channels then start on a float4).
  static bool Quads(const ConvGeometry& g, const float* a, const float* b) {
    return g.channels % 4 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(b) % 16 == 0;
  }

  // Calls launch(Index{}) with Index = int32_t when every index of a window operation on g fits
  // in it (cheaper division on the device), else with int64_t, then checks the launch of
  // `kernel` (its name, for the error).
  template <typename Launch>
  void WithIndexType(const ConvGeometry& g, const char* kernel, const Launch& launch) const {
    if (FitsInt32(g)) {
      launch(int32_t{0});
    } else {
      launch(int64_t{0});
    }
    PS_CUDA_CHECK_LAUNCH(kernel);
  }

  // Whether every index of a window operation on g fits in int32_t.
  static bool FitsInt32(const ConvGeometry& g) {
    // Half the range: a grid-stride step past the end must not overflow either.
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max() / 2;
    return g.input_size() <= kMax && g.output_positions() * g.patch_size() <= kMax;
  }

  // Threads for one block per row of `classes`: a multiple of the warp size, up to 256.
  static int RowThreads(int classes) {
    const int warps = std::min((classes + kWarpSize - 1) / kWarpSize, kThreadsPerBlock / kWarpSize);
    return std::max(warps, 1) * kWarpSize;
  }

  // x covers the dimensions (a whole number of warps, up to 256), y packs several examples
  // into one block when dim is small.
  static dim3 EmbeddingBlock(int dim) {
    const int x = std::min((dim + kWarpSize - 1) / kWarpSize * kWarpSize, kThreadsPerBlock);
    return dim3(x, kThreadsPerBlock / x);
  }

  template <Activation F>
  void LaunchActivationForward(const float* x, int64_t n, float* y) {
    ActivationForwardKernel<F><<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(x, n, y);
    PS_CUDA_CHECK_LAUNCH("ActivationForwardKernel");
  }

  template <Activation F>
  void LaunchActivationBackward(const float* y, const float* dy, int64_t n, float* dx) {
    ActivationBackwardKernel<F><<<Blocks(n), kThreadsPerBlock, 0, stream_>>>(y, dy, n, dx);
    PS_CUDA_CHECK_LAUNCH("ActivationBackwardKernel");
  }

  void CopyAsync(void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind) {
    if (bytes <= 0) return;
    MakeCurrent();
    PS_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, stream_));
  }

  // out0[c] (and out1[c] for a two-valued Load) = scale * the sum over rows of load's values
  // in column c; see ColumnPartialSumsKernel. REQUIRES: rows > 0, cols > 0, MakeCurrent().
  template <typename Load>
  void ColumnSums(const Load& load, int64_t rows, int cols, double scale, float* out0,
                  float* out1) {
    const int tile_cols = std::min(cols, kReduceThreads);
    const int col_tiles = (cols + tile_cols - 1) / tile_cols;
    const int rows_per_step = kReduceThreads / tile_cols;
    const int64_t steps = (rows + rows_per_step - 1) / rows_per_step;
    const int max_row_blocks = std::max(1, multiprocessors_ * 8 / col_tiles);
    const int row_blocks = static_cast<int>(std::clamp<int64_t>(
        (steps + kMinStepsPerBlock - 1) / kMinStepsPerBlock, 1, max_row_blocks));
    float* partials = Scratch(int64_t{row_blocks} * Load::kValues * cols);
    ColumnPartialSumsKernel<Load>
        <<<dim3(row_blocks, col_tiles), kReduceThreads, 0, stream_>>>(load, rows, cols, partials);
    PS_CUDA_CHECK_LAUNCH("ColumnPartialSumsKernel");
    ColumnFinalSumsKernel<<<Load::kValues * cols, kFinalThreads, 0, stream_>>>(
        partials, row_blocks, cols, Load::kValues, scale, out0, out1);
    PS_CUDA_CHECK_LAUNCH("ColumnFinalSumsKernel");
  }

  // Device scratch of at least n floats for the reductions: Init allocates what every
  // reduction of fewer than 272,000 columns needs; wider ones grow it (outside
  // memory_limit_bytes, as Init's) and a device without room for that stops the process.
  float* Scratch(int64_t n) {
    if (n <= scratch_floats_) return scratch_;
    const int64_t size = std::max(n, 2 * scratch_floats_);
    MakeCurrent();
    // A captured graph may still use the old buffer: it is kept until the end.
    retired_scratch_.push_back(scratch_);
    scratch_ = nullptr;
    scratch_floats_ = 0;
    void* p = nullptr;
    PS_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(size) * sizeof(float)));
    scratch_ = static_cast<float*>(p);
    scratch_floats_ = size;
    return scratch_;
  }

  absl::StatusOr<void*> Allocate(int64_t n, int64_t element_size, const char* what) {
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", n, " ", what));
    }
    if (n > std::numeric_limits<int64_t>::max() / element_size) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name_, ": cannot allocate ", n, " ", what, ": the size overflows"));
    }
    // At least one element, so that every allocation is a distinct, non-null pointer.
    const int64_t bytes = std::max<int64_t>(n, 1) * element_size;
    if (memory_limit_bytes_ > 0 && bytes > memory_limit_bytes_ - bytes_in_use_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          name_, ": cannot allocate ", bytes, " bytes: ", bytes_in_use_, " bytes in use, limit ",
          memory_limit_bytes_, " bytes (CudaKernelsOptions.memory_limit_bytes)"));
    }
    MakeCurrent();
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (err == cudaErrorMemoryAllocation) {
      // Not sticky: clear it so that the next launch check does not report it.
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat(name_, ": cudaMalloc of ", bytes, " bytes failed (", bytes_in_use_,
                       " bytes in use by this worker): ", cudaGetErrorString(err)));
    }
    PS_CUDA_CHECK(err);
    allocations_.emplace(p, bytes);
    bytes_in_use_ += bytes;
    return p;
  }

  const int device_;
  const std::string name_;
  const int64_t memory_limit_bytes_;  // 0: no cap
  int multiprocessors_ = 1;
  cudaStream_t stream_ = nullptr;           // Owned: compute.
  cudaStream_t upload_stream_ = nullptr;    // Owned: host-to-device copies.
  cudaStream_t download_stream_ = nullptr;  // Owned: device-to-host copies.
  cublasHandle_t cublas_ = nullptr;         // Owned; bound to stream_.
  // Page-locked host memory; taken and freed from any thread.
  absl::Mutex host_mu_;
  std::unordered_set<void*> host_allocations_ ABSL_GUARDED_BY(host_mu_);
  // Every live allocation and its size in bytes; the destructor frees what is left.
  std::unordered_map<void*, int64_t> allocations_;
  int64_t bytes_in_use_ = 0;
  // Partial sums of the column reductions (one of allocations_); null until first needed.
  float* scratch_ = nullptr;
  int64_t scratch_floats_ = 0;
  std::vector<float*> retired_scratch_;  // outgrown, freed by the destructor
  void* cublas_workspace_ = nullptr;     // Owned: cuBLAS's, set once (graphs record it)
};

// Towers on several devices of this process: one NCCL communicator per device, an all-reduce
// in a group so that one thread issues every device's part.
class NcclTowerReducer final : public TowerReducer {
 public:
  NcclTowerReducer(std::vector<CudaKernels*> towers, std::vector<ncclComm_t> comms)
      : towers_(std::move(towers)), comms_(std::move(comms)) {}
  ~NcclTowerReducer() override {
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }

  absl::Status AllReduceSum(const std::vector<float*>& buffers, int64_t n) override {
    if (buffers.size() != towers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("AllReduceSum of ", buffers.size(),
                                                     " buffers over ", towers_.size(), " towers"));
    }
    if (n <= 0) return absl::OkStatus();
    ncclResult_t r = ncclGroupStart();
    for (size_t i = 0; i < towers_.size() && r == ncclSuccess; ++i) {
      PS_CUDA_CHECK(cudaSetDevice(towers_[i]->device()));
      r = ncclAllReduce(buffers[i], buffers[i], static_cast<size_t>(n), ncclFloat, ncclSum,
                        comms_[i], towers_[i]->compute_stream());
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess) r = end;
    if (r != ncclSuccess) {
      return absl::InternalError(absl::StrCat("ncclAllReduce over ", towers_.size(),
                                              " GPUs failed: ", ncclGetErrorString(r)));
    }
    return absl::OkStatus();
  }

 private:
  const std::vector<CudaKernels*> towers_;  // Not owned.
  std::vector<ncclComm_t> comms_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TowerReducer>> NewCudaTowerReducer(
    const std::vector<Kernels*>& towers) {
  // NVLink multicast (NVLS) can take a shared host's GPUs out of service: NCCL never uses it
  // here, whatever the environment of whoever started this process says.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  std::vector<CudaKernels*> cuda;
  std::vector<int> devices;
  for (Kernels* k : towers) {
    auto* c = dynamic_cast<CudaKernels*>(k);
    if (c == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(k->name(), " is not a CUDA device"));
    }
    for (int d : devices) {
      if (d == c->device()) {
        return absl::InvalidArgumentError(absl::StrCat("GPU ", d, " is named twice"));
      }
    }
    cuda.push_back(c);
    devices.push_back(c->device());
  }
  std::vector<ncclComm_t> comms(devices.size());
  const ncclResult_t r =
      ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data());
  if (r != ncclSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL cannot join GPUs ", absl::StrJoin(devices, ", "), ": ", ncclGetErrorString(r)));
  }
  return std::unique_ptr<TowerReducer>(new NcclTowerReducer(std::move(cuda), std::move(comms)));
}

absl::StatusOr<std::unique_ptr<Kernels>> NewCudaKernels(const CudaKernelsOptions& options) {
  if (options.memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory_limit_bytes must be >= 0 (0 means no cap), got ", options.memory_limit_bytes));
  }
  // Names the device and what is wrong: no driver, or no such ordinal.
  const CudaDeviceInfo info = ProbeCudaDevice(options.device);
  if (!info.ok) return absl::FailedPreconditionError(info.error);
  auto kernels =
      std::make_unique<CudaKernels>(options.device, info.name, options.memory_limit_bytes);
  const absl::Status status = kernels->Init();
  if (!status.ok()) return status;
  return std::unique_ptr<Kernels>(std::move(kernels));
}

}  // namespace pscluster
