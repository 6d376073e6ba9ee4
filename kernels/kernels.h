#ifndef PSCLUSTER_KERNELS_KERNELS_H_
#define PSCLUSTER_KERNELS_KERNELS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pscluster {

enum class Activation { kLinear, kRelu, kSigmoid, kTanh };

// One optimizer update of a variable, element-wise, in the order of operations of the ps's
// optimizer of the same kind (ps_server/optimizer.h, which gives the constants:
// Optimizer::ConstantsAt), so that a worker's local steps update as the ps would:
//   kSgd            var -= lr * g
//   kMomentum       slot0 = momentum * slot0 + g; var -= lr * slot0
//                   (nesterov: var -= lr * g + lr * momentum * slot0)
//   kAdam           slot0 (m) += (1 - beta1) * (g - m); slot1 (v) += (1 - beta2) * (g^2 - v);
//                   var -= lr * m / (sqrt(v) + epsilon)      (lr: with the bias correction)
//   kMovingAverage  var -= (1 - momentum) * (var - g)        (g: an observation)
struct ElementwiseUpdate {
  enum class Kind { kSgd, kMomentum, kAdam, kMovingAverage };
  Kind kind = Kind::kSgd;
  float lr = 0;
  float beta1 = 0;
  float beta2 = 0;
  float epsilon = 0;
  float momentum = 0;
  bool nesterov = false;
};

// The geometry of a 2-D convolution or pooling window over an NHWC input [batch x height x width
// x channels]. TensorFlow's "SAME" padding: out = ceil(in / stride), pad_total = max((out - 1) *
// stride + kernel - in, 0), pad_top = pad_total / 2 (the extra row goes at the bottom); "VALID":
// out = (in - kernel) / stride + 1, no padding.
struct ConvGeometry {
  int batch = 0;
  int height = 0;
  int width = 0;
  int channels = 0;
  int kernel_h = 1;
  int kernel_w = 1;
  int stride_h = 1;
  int stride_w = 1;
  int pad_top = 0;
  int pad_left = 0;
  int out_h = 0;
  int out_w = 0;

  int64_t input_size() const { return int64_t{batch} * height * width * channels; }
  int64_t output_positions() const { return int64_t{batch} * out_h * out_w; }
  // Im2Col's row length.
  int64_t patch_size() const { return int64_t{kernel_h} * kernel_w * channels; }
};

// The compute a worker needs for forward and backward passes, on one device: a CPU
// implementation (Eigen's matrix products, which are a real BLAS-quality GEMM) and a CUDA one
// (cuBLAS for the products, small kernels for the rest) behind one interface. No RPC in here.
//
// All pointers given to the compute methods are device memory from Allocate*() of the same
// Kernels object (host memory for the CPU backend). Matrices are row-major. Compute calls are
// issued in order on the compute stream; results are visible to CopyToHost(), which waits for
// them.
//
// Overlap: besides the compute stream there are two copy streams (uploads and downloads), host
// memory that copies on them can use without staging (page-locked, for CUDA), and events to
// order work across streams and with the host. The CPU backend does every copy at once and its
// events are always complete.
//
// Thread-safety: the compute methods, Allocate*/Free and the synchronous copies are
// thread-compatible (one thread at a time, e.g. the training thread). The asynchronous copies,
// AllocateHost/FreeHost and the event methods may be called from any thread, concurrently
// with the rest (a pull thread uploads parameters while the training thread computes).
class Kernels {
 public:
  virtual ~Kernels() = default;

  enum class Stream { kCompute = 0, kUpload = 1, kDownload = 2 };

  // A point in a stream's work. Owned by the caller; created by NewEvent() of the Kernels it
  // is used with.
  class Event {
   public:
    virtual ~Event() = default;
  };

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
  virtual void SigmoidCrossEntropy(const float* logits, const float* labels, int rows, float* loss,
                                   float* dlogits) = 0;

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

  // Copies rows of 4-byte words (floats, or int32 labels): out[i * row + j] =
  // table[index[i] * row + j] for i in [0, n), j in [0, row); index holds n row numbers. A batch
  // gathered from a dataset kept on the device.
  virtual void GatherRows(const void* table, const int32_t* index, int n, int64_t row,
                          void* out) = 0;

  // One update (see ElementwiseUpdate) of var[0, n) with grad[0, n); slot0 and slot1 are the
  // kind's slots (null where it has none). None of them overlap.
  virtual void ApplyUpdate(const ElementwiseUpdate& update, int64_t n, const float* grad,
                           float* var, float* slot0, float* slot1) = 0;

  // y[i] *= alpha for i in [0, n).
  virtual void Scale(int64_t n, float alpha, float* y) = 0;

  // ---- Convolutional layers (NHWC tensors, row-major: channels vary fastest) ----

  // y[i] = alpha * x[i] for i in [0, n); x and y may alias (a device-to-device copy when
  // alpha is 1).
  virtual void ScaleCopy(int64_t n, float alpha, const float* x, float* y) = 0;
  // out[i] = a[i] + b[i]; out may alias a or b (residual additions).
  virtual void Add(int64_t n, const float* a, const float* b, float* out) = 0;

  // cols[p, (kh * kernel_w + kw) * channels + c] = x[n, oh * stride_h - pad_top + kh,
  // ow * stride_w - pad_left + kw, c] for the output position p = (n * out_h + oh) * out_w + ow,
  // or 0 where that lies in the padding. cols is [batch * out_h * out_w x kernel_h * kernel_w *
  // channels], so that a convolution is Gemm(cols, kernel [kernel_h * kernel_w * channels x
  // filters]) -> [batch * out_h * out_w x filters], an NHWC output (TensorFlow's HWIO kernel).
  virtual void Im2Col(const ConvGeometry& g, const float* x, float* cols) = 0;
  // The adjoint of Im2Col: dx[n, h, w, c] = the sum of every dcols element that Im2Col read from
  // x[n, h, w, c]. Overwrites dx (no accumulation); deterministic (no atomics).
  virtual void Col2Im(const ConvGeometry& g, const float* dcols, float* dx) = 0;

  // Max pooling over windows of g (each channel separately):
  // y[n, oh, ow, c] = the max of the window's input positions that lie inside x (padding never
  // wins), and argmax[same index] = the flat index into x of the first position holding it.
  virtual void MaxPoolForward(const ConvGeometry& g, const float* x, float* y, int32_t* argmax) = 0;
  // dx[i] = the sum of dy[o] over every output o with argmax[o] == i. Overwrites dx;
  // deterministic.
  virtual void MaxPoolBackward(const ConvGeometry& g, const float* dy, const int32_t* argmax,
                               float* dx) = 0;

  // Average pooling over windows of g (each channel separately): y[n, oh, ow, c] = the mean of
  // the window's input positions that lie inside x (padding is not counted, as TensorFlow's
  // avg_pool). A window with none gives 0.
  virtual void AvgPoolForward(const ConvGeometry& g, const float* x, float* y) = 0;
  // dx[i] = the sum, over every window o covering input position i, of dy[o] / (o's count of
  // positions inside x). Overwrites dx; deterministic.
  virtual void AvgPoolBackward(const ConvGeometry& g, const float* dy, float* dx) = 0;

  // y[n, c] = the mean of x[n, p, c] over p in [0, positions) (x is [batch x positions x
  // channels]).
  virtual void GlobalAvgPoolForward(const float* x, int batch, int positions, int channels,
                                    float* y) = 0;
  // dx[n, p, c] = dy[n, c] / positions.
  virtual void GlobalAvgPoolBackward(const float* dy, int batch, int positions, int channels,
                                     float* dx) = 0;

  // Batch normalization in training, over x [rows x channels] (rows = batch * height * width):
  // mean[c] and variance[c] (biased: divided by rows) of column c, and
  // y = gamma * (x - mean) / sqrt(variance + epsilon) + beta. y may not alias x.
  virtual void BatchNormForwardTraining(const float* x, int64_t rows, int channels,
                                        const float* gamma, const float* beta, float epsilon,
                                        float* y, float* mean, float* variance) = 0;
  // The same with given statistics (evaluation: the moving mean and variance).
  virtual void BatchNormForwardInference(const float* x, int64_t rows, int channels,
                                         const float* gamma, const float* beta, const float* mean,
                                         const float* variance, float epsilon, float* y) = 0;
  // The gradients of BatchNormForwardTraining's y with respect to gamma, beta and x, given dy and
  // the mean and variance it computed: with xhat = (x - mean) / sqrt(variance + epsilon),
  // dbeta[c] = sum of dy, dgamma[c] = sum of dy * xhat, and
  // dx = gamma / sqrt(variance + epsilon) * (dy - (dbeta + xhat * dgamma) / rows).
  // dx may alias dy.
  virtual void BatchNormBackward(const float* x, const float* dy, int64_t rows, int channels,
                                 const float* gamma, const float* mean, const float* variance,
                                 float epsilon, float* dgamma, float* dbeta, float* dx) = 0;

  // ---- Overlap of transfers with compute ----

  // True when device memory is host memory (the CPU backend): a caller may hand host buffers
  // to the compute methods and skip the copies.
  virtual bool device_is_host() const = 0;

  // The device's memory, in bytes: in use (by every process on it) and in all. Zero for the
  // host backend. Callable from any thread (metrics scrapes).
  struct MemoryInfo {
    int64_t used_bytes = 0;
    int64_t total_bytes = 0;
  };
  virtual MemoryInfo DeviceMemory() { return MemoryInfo(); }

  // Host memory for the asynchronous copies (CUDA: page-locked, so a copy needs no staging
  // and runs while the host goes on). RESOURCE_EXHAUSTED when none is left.
  virtual absl::StatusOr<void*> AllocateHost(int64_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;

  // Copies on `stream`, after the stream's earlier work. The host buffer must stay valid (and,
  // for an upload, unchanged) until an event recorded after the copy is complete. CPU: done at
  // once.
  virtual void CopyToDeviceAsync(Stream stream, const void* host, void* device, int64_t bytes) = 0;
  virtual void CopyToHostAsync(Stream stream, const void* device, void* host, int64_t bytes) = 0;
  // `rows` rows of `row_bytes` each, from host rows `host_pitch` bytes apart to device rows
  // `device_pitch` bytes apart (the dense features of a batch into the first columns of the
  // model's input).
  virtual void CopyRowsToDeviceAsync(Stream stream, const void* host, int64_t host_pitch,
                                     void* device, int64_t device_pitch, int64_t row_bytes,
                                     int64_t rows) = 0;

  virtual std::unique_ptr<Event> NewEvent() = 0;
  // Marks the current end of `stream`'s work in `event` (replacing what it marked before).
  virtual void Record(Event* event, Stream stream) = 0;
  // Work issued on `stream` from now on starts after `event`'s point (the host does not wait).
  virtual void Wait(Stream stream, Event* event) = 0;
  // The host waits until `event`'s point is reached. An event never recorded is complete.
  virtual void Synchronize(Event* event) = 0;

  // ---- Graphs: a step's compute recorded once and replayed as one launch ----

  // Work on the compute stream recorded by BeginCapture/EndCapture (CUDA: an instantiated
  // CUDA graph). Owned by the caller; launched on the Kernels that captured it.
  class Graph {
   public:
    virtual ~Graph() = default;
  };

  // Whether BeginCapture can succeed (CUDA).
  virtual bool can_capture() const { return false; }
  // From now until EndCapture, the compute methods called on this thread are recorded instead
  // of run: they read and write the same device memory when the graph is launched, with the
  // scalar arguments (sizes, alpha, learning rates) they were given now. Only compute methods
  // may be called in between: no copies to or from the host, events, Allocate* or Free.
  // UNIMPLEMENTED for a backend that cannot (the CPU's, whose launches cost nothing).
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError(name() + " cannot capture its work in a graph");
  }
  // Ends the recording and makes the graph. A failed capture (something recorded that a graph
  // cannot hold) is INTERNAL, and nothing of what was recorded has run.
  virtual absl::StatusOr<std::unique_ptr<Graph>> EndCapture() {
    return absl::UnimplementedError(name() + " cannot capture its work in a graph");
  }
  // Runs the graph's work on the compute stream, after the work issued there before.
  virtual void Launch(Graph* graph) {}
};

// Sums equal-sized float buffers that live on several Kernels (the towers of a multi-GPU
// worker) in place, so that every buffer ends up holding the sum: NCCL's all-reduce for CUDA
// devices, a plain loop for CPU ones. Each Kernels' compute stream runs its part, after the
// work issued on it so far. Thread-compatible.
class TowerReducer {
 public:
  virtual ~TowerReducer() = default;
  // buffers[i] is device memory of the i-th Kernels given at creation, n floats each.
  virtual absl::Status AllReduceSum(const std::vector<float*>& buffers, int64_t n) = 0;
};

// A reducer over `towers` (not owned; they outlive it), all of one backend. One tower: a
// reducer that does nothing. INVALID_ARGUMENT for mixed backends; FAILED_PRECONDITION when NCCL
// cannot set up the devices; UNIMPLEMENTED for CUDA towers in a build without --config=cuda.
absl::StatusOr<std::unique_ptr<TowerReducer>> NewTowerReducer(const std::vector<Kernels*>& towers);

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

// NewTowerReducer's CUDA case: NCCL communicators over the towers' devices (one process, one
// communicator per device). REQUIRES: every tower came from NewCudaKernels, on distinct devices.
// UNIMPLEMENTED without --config=cuda.
absl::StatusOr<std::unique_ptr<TowerReducer>> NewCudaTowerReducer(
    const std::vector<Kernels*>& towers);

}  // namespace pscluster

#endif  // PSCLUSTER_KERNELS_KERNELS_H_
