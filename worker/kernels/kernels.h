#ifndef PSCLUSTER_WORKER_KERNELS_KERNELS_H_
#define PSCLUSTER_WORKER_KERNELS_KERNELS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace pscluster {

enum class Activation { kLinear, kRelu, kSigmoid, kTanh };

// The compute a worker needs for forward and backward passes, on one device: a CPU
// implementation (Eigen's matrix products, which are a real BLAS-quality GEMM) and a CUDA one
// (cuBLAS for the products, small kernels for the rest) behind one interface. No RPC in here.
//
// All pointers given to the compute methods are device memory from Allocate*() of the same
// Kernels object (host memory for the CPU backend). Matrices are row-major. Calls are issued in
// order on one stream; results are visible to CopyToHost(), which waits for them.
//
// Thread-compatible: one Kernels per training thread.
class Kernels {
 public:
  virtual ~Kernels() = default;

  // "cpu" or "cuda:N (<device name>)".
  virtual std::string name() const = 0;

  // Device memory. RESOURCE_EXHAUSTED when the device (or the memory cap) has no room.
  virtual absl::StatusOr<float*> AllocateFloats(int64_t n) = 0;
  virtual absl::StatusOr<int32_t*> AllocateInts(int64_t n) = 0;
  virtual void Free(void* p) = 0;
  virtual void CopyToDevice(const float* host, float* device, int64_t n) = 0;
  virtual void CopyToDevice(const int32_t* host, int32_t* device, int64_t n) = 0;
  virtual void CopyToHost(const float* device, float* host, int64_t n) = 0;
  // The int32 counterpart of CopyToHost (ArgMax's predictions); it also waits for prior calls.
  virtual void CopyToHostInts(const int32_t* device, int32_t* host, int64_t n) = 0;

  // c[m x n] = alpha * op(a) * op(b) + beta * c, where op(a) is [m x k] (a is [k x m] when
  // trans_a) and op(b) is [k x n] (b is [n x k] when trans_b). As in BLAS, c is not read when
  // beta is 0, so it may hold garbage (e.g. NaN from fresh device memory).
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) = 0;

  // x[r, c] += bias[c] for an x of [rows x cols].
  virtual void AddBias(const float* bias, int rows, int cols, float* x) = 0;
  // dbias[c] = sum over r of dy[r, c].
  virtual void BiasGrad(const float* dy, int rows, int cols, float* dbias) = 0;

  // y = f(x), elementwise; x and y may alias.
  virtual void ActivationForward(Activation f, const float* x, int64_t n, float* y) = 0;
  // dx = dy * f'(x), written in terms of the output y = f(x); dy and dx may alias.
  virtual void ActivationBackward(Activation f, const float* y, const float* dy, int64_t n,
                                  float* dx) = 0;

  // Softmax cross-entropy over logits [rows x classes] with integer labels [rows]:
  // loss[r] = -log softmax(logits[r])[labels[r]], and dlogits = (softmax - onehot) / rows
  // (the gradient of the batch's mean loss). Numerically stable (max subtracted).
  virtual void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                   int classes, float* loss, float* dlogits) = 0;
  // Predicted class (argmax) of each row of logits [rows x classes].
  virtual void ArgMax(const float* logits, int rows, int classes, int32_t* out) = 0;

  // Sigmoid binary cross-entropy over logits [rows] with labels in {0, 1} [rows]:
  // loss[r] = max(z, 0) - z * y + log(1 + exp(-|z|)), dlogits = (sigmoid(z) - y) / rows.
  virtual void SigmoidCrossEntropy(const float* logits, const float* labels, int rows,
                                   float* loss, float* dlogits) = 0;

  // Embedding bag. `rows` holds the distinct embedding rows this batch touches ([num_rows x
  // dim]); example b's ids are row_index[offsets[b] .. offsets[b + 1]) (indices into `rows`).
  // out[b, out_col .. out_col + dim) = sum (or mean when `mean`) of those rows; out's row
  // stride is out_stride floats. An example with no ids gets zeros.
  virtual void EmbeddingBagForward(const float* rows, const int32_t* row_index,
                                   const int32_t* offsets, int batch, int dim, bool mean,
                                   int out_stride, int out_col, float* out) = 0;
  // The matching backward pass: drows ([num_rows x dim], zeroed first by the caller) +=
  // the gradient of each row, scatter-added from dout[b, out_col .. out_col + dim).
  virtual void EmbeddingBagBackward(const float* dout, const int32_t* row_index,
                                    const int32_t* offsets, int batch, int dim, bool mean,
                                    int out_stride, int out_col, float* drows) = 0;

  // y[i] += alpha * x[i] for i in [0, n); x and y do not overlap.
  virtual void Axpy(int64_t n, float alpha, const float* x, float* y) = 0;

  // Sets n floats to `value`.
  virtual void Fill(float* x, int64_t n, float value) = 0;
};

// The CPU backend. Never fails.
std::unique_ptr<Kernels> NewCpuKernels();

struct CudaKernelsOptions {
  // Index among the devices CUDA_VISIBLE_DEVICES exposes.
  int device = 0;
  // Cap on the device memory this worker allocates, in bytes; 0 means no cap beyond the
  // device's own (TensorFlow's per-process memory fraction, as an absolute figure).
  int64_t memory_limit_bytes = 0;
};

// The CUDA backend. FAILED_PRECONDITION naming the device when it does not exist or no driver
// is present; UNIMPLEMENTED when the binary was built without --config=cuda.
absl::StatusOr<std::unique_ptr<Kernels>> NewCudaKernels(const CudaKernelsOptions& options);

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_KERNELS_KERNELS_H_
