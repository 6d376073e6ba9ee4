#ifndef PSCLUSTER_MODEL_MODEL_H_
#define PSCLUSTER_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "proto/model.pb.h"
#include "proto/model_config.pb.h"

namespace pscluster {

// The variables and tables a config needs on the ps tasks: for each dense layer L,
// "L/kernel" [in, units] and "L/bias" [units]; for each embedding layer, its table. Layers get
// the config's optimizer and seed unless they name their own. INVALID_ARGUMENT for a config
// that cannot be built (naming the layer): no layers, units < 1, a last layer that is not
// linear, a sigmoid loss with more than one output, a wide layer whose dim is not the output
// size, duplicate names.
absl::StatusOr<v1::ModelSpec> ModelSpecFromConfig(const v1::ModelConfig& config);

// One batch of examples, in host memory. Not owned.
struct Batch {
  int size = 0;
  const float* dense = nullptr;             // [size x input_dim]
  const int64_t* sparse_offsets = nullptr;  // [size + 1], or null without sparse features
  const int64_t* sparse_ids = nullptr;
  const float* labels = nullptr;  // [size]: class index, or 0/1
};

// A batch's sparse ids, deduplicated: the rows to pull, and each id's index into them.
struct SparseInput {
  std::vector<int64_t> unique_ids;
  std::vector<int32_t> row_index;  // per id of the batch, in order
  std::vector<int32_t> offsets;    // [size + 1] into row_index
};

struct StepResult {
  double loss = 0;      // mean over the batch
  int64_t correct = 0;  // classification: argmax == label; binary: (p > 0.5) == label
  // Gradients of the mean loss, per dense variable (Model::dense_variables order) and per
  // table (Model::tables order, rows of SparseInput::unique_ids).
  std::vector<std::vector<float>> dense_grads;
  std::vector<std::vector<float>> row_grads;
  // Binary tasks: the predicted probability of each example (for AUC).
  std::vector<float> scores;
};

// A model's forward and backward passes on a Kernels backend. The parameters are not kept
// here: each step is given the current values (pulled from the ps tasks) and leaves gradients.
//
// Two ways to run a step:
//  - Compute(): everything in host memory, synchronous (evaluation, tests);
//  - StageInputs() then Enqueue(): the overlapped path of the training loop. The inputs of a
//    batch are copied into one of kInputSlots page-locked staging areas and uploaded on the
//    upload stream (while the previous batch computes); Enqueue issues the forward and
//    backward passes on the compute stream, reading parameters from device memory the caller
//    uploaded, calling hooks so that the caller can order its own copies around them
//    (parameters wanted layer by layer, gradients handed out as backward produces them), and
//    downloads the per-example loss and predictions to host memory on the download stream.
//    Nothing in it waits for the device.
//
// Gradients of the dense variables are packed in one device buffer (device_grads(), variable i
// at dense_offsets()[i]), so that towers can all-reduce them at once.
//
// Thread-compatible; StageInputs may run on another thread than Enqueue, for different slots.
class Model {
 public:
  // Input staging areas: batch s + 1 is staged while batch s computes.
  static constexpr int kInputSlots = 2;

  // `kernels` is not owned and must outlive the model. Device buffers are sized for
  // `max_batch` examples.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const v1::ModelConfig& config,
                                                       Kernels* kernels, int max_batch);
  ~Model();

  const v1::ModelConfig& config() const { return config_; }
  Kernels* kernels() const { return kernels_; }
  int max_batch() const { return max_batch_; }
  const std::vector<std::string>& dense_variables() const { return dense_names_; }
  const std::vector<int64_t>& dense_sizes() const { return dense_sizes_; }
  // Offsets of the dense variables in the packed gradient, and its length.
  const std::vector<int64_t>& dense_offsets() const { return dense_offsets_; }
  int64_t dense_total() const { return dense_total_; }
  // One per embedding layer, in config order.
  const std::vector<std::string>& tables() const { return table_names_; }
  const std::vector<int>& table_dims() const { return table_dims_; }
  // Dense layers; layer l reads dense variables 2l (kernel) and 2l + 1 (bias).
  int num_layers() const { return static_cast<int>(layers_.size()); }

  // Deduplicates a batch's sparse ids (every embedding layer reads all of them).
  static void PrepareSparse(const Batch& batch, SparseInput* sparse);

  // Runs the forward pass, and the backward pass when `backward`, with host parameters:
  // params[i] has dense_sizes()[i] floats; rows[t] has sparse.unique_ids.size() *
  // table_dims()[t] floats. Waits for the device. INVALID_ARGUMENT for a batch larger than
  // max_batch or a label out of range.
  absl::Status Compute(const Batch& batch, const SparseInput& sparse,
                       const std::vector<const float*>& params,
                       const std::vector<const float*>& rows, bool backward, StepResult* result);

  // ---- The overlapped path ----

  // Copies `batch` (and its sparse ids) into staging slot `slot` and starts the upload. Waits
  // (host side) until the slot's previous upload has completed, and makes the upload wait
  // until the compute stream is done with the slot's previous batch. INVALID_ARGUMENT as
  // Compute, before anything is copied. The batch's memory may be reused when it returns.
  absl::Status StageInputs(int slot, const Batch& batch, const SparseInput& sparse);
  // As StageInputs for a model without embedding tables, with the batch gathered straight from
  // a dataset into the staging area: examples positions[0..n) of `dense` ([examples x
  // input_dim]) and `labels`. FAILED_PRECONDITION for a model with tables.
  absl::Status StageGathered(int slot, const float* dense, const float* labels,
                             const int64_t* positions, int n);

  // Where Enqueue tells the caller what it reached.
  struct Hooks {
    // Before the first kernel that reads dense layer l's parameters (l = 0, 1, ...): the
    // caller makes the compute stream wait for their upload.
    std::function<void(int layer)> before_layer;
    // Before the first kernel that writes a gradient: the caller makes the compute stream wait
    // until the previous step's gradients were downloaded.
    std::function<void()> before_backward;
    // Dense variable i's gradient is complete in device_grads() (last layer first); for a
    // table t, num_dense + t, complete in device_row_grads(t).
    std::function<void(int variable)> gradient_ready;
    // Before the tower gradients are final: with towers, the caller all-reduces the packed
    // gradient here (after every gradient of this tower was issued, before gradient_ready).
    std::function<absl::Status()> reduce_gradients;
  };

  // Where Enqueue downloads the step's outputs: host memory from kernels()->AllocateHost,
  // max_batch() elements each, valid once `ready` (an event of this model's kernels) is
  // complete.
  struct Outputs {
    float* loss = nullptr;           // per example
    int32_t* predictions = nullptr;  // softmax: argmax per example
    float* logits = nullptr;         // sigmoid: the logit per example
    Kernels::Event* ready = nullptr;
  };

  // Issues the step on the batch staged in `slot`: forward, the loss, and backward when
  // `backward`, with dense parameters params[i] and table rows rows[t] in device memory.
  // `gradient_scale` multiplies every gradient (towers: a tower's share of the whole batch).
  // Does not wait for the device.
  absl::Status Enqueue(int slot, const std::vector<const float*>& params,
                       const std::vector<const float*>& rows, bool backward, float gradient_scale,
                       const Hooks& hooks, const Outputs& outputs);

  // The staged batch's size and, for tables, its unique ids (valid until the slot is staged
  // again).
  int staged_size(int slot) const { return inputs_[slot].size; }
  int64_t staged_rows(int slot) const { return inputs_[slot].num_rows; }

  // Device buffers holding the last Enqueue's gradients.
  float* device_grads() const { return grads_; }
  float* device_row_grads(int table) const { return drows_[table]; }
  // Device buffer for table t's rows of a step, grown to hold n rows (allocates only to grow).
  // One per input slot: the rows of step s + 1 are uploaded while step s computes.
  absl::StatusOr<float*> RowBuffer(int slot, int table, int64_t n);

 private:
  struct Layer {
    int in = 0;
    int units = 0;
    Activation activation = Activation::kLinear;
    float* dkernel = nullptr;  // views into grads_
    float* dbias = nullptr;
    float* out = nullptr;  // [max_batch x units]
    float* dout = nullptr;
  };
  struct Embedding {
    int dim = 0;
    bool mean = false;
    bool wide = false;
    int col = 0;  // column of its output in the first layer's input
  };
  // One staging area and the device inputs uploaded from it.
  struct Inputs {
    int size = 0;
    int64_t num_rows = 0;
    // Host (page-locked).
    float* host_dense = nullptr;   // [max_batch x input_dim]
    float* host_labels = nullptr;  // [max_batch]
    int32_t* host_int_labels = nullptr;
    std::vector<int32_t> host_row_index;  // grown as needed; not page-locked
    int32_t* host_offsets = nullptr;      // [max_batch + 1]
    // Device.
    float* x0 = nullptr;  // [max_batch x input_width]
    float* labels = nullptr;
    int32_t* int_labels = nullptr;
    int32_t* row_index = nullptr;
    int64_t row_index_capacity = 0;
    int32_t* offsets = nullptr;
    std::vector<float*> rows;  // per table
    std::vector<int64_t> rows_capacity;
    std::unique_ptr<Kernels::Event> uploaded;  // upload stream
    std::unique_ptr<Kernels::Event> consumed;  // compute stream: done reading the inputs
  };

  Model(v1::ModelConfig config, Kernels* kernels, int max_batch);
  absl::Status Allocate();
  absl::StatusOr<float*> Floats(int64_t n);
  absl::StatusOr<int32_t*> Ints(int64_t n);
  // Starts the upload of the slot's staged inputs.
  void Upload(int slot);
  // Checks labels against the loss: INVALID_ARGUMENT naming the example.
  absl::Status CheckLabels(const Batch& batch) const;
  // Grows a device buffer to hold n elements.
  absl::Status Reserve(float** buffer, int64_t* capacity, int64_t n);

  const v1::ModelConfig config_;
  Kernels* const kernels_;  // Not owned.
  const int max_batch_;
  int input_width_ = 0;  // dense features plus concatenated embeddings
  std::vector<std::string> dense_names_;
  std::vector<int64_t> dense_sizes_;
  std::vector<int64_t> dense_offsets_;
  int64_t dense_total_ = 0;
  std::vector<std::string> table_names_;
  std::vector<int> table_dims_;
  std::vector<Layer> layers_;
  std::vector<Embedding> embeddings_;
  std::vector<void*> owned_;  // every device allocation
  std::vector<void*> owned_host_;
  Inputs inputs_[kInputSlots];
  float* grads_ = nullptr;  // packed dense gradients
  float* dx0_ = nullptr;
  int32_t* predictions_ = nullptr;
  float* loss_ = nullptr;
  float* wide_out_ = nullptr;
  std::vector<float*> drows_;
  std::vector<int64_t> drows_capacity_;
  // Compute(): device copies of the host parameters and rows, and host outputs.
  float* compute_params_ = nullptr;
  std::vector<float*> compute_rows_;
  std::vector<int64_t> compute_rows_capacity_;
  Outputs compute_outputs_;
  std::unique_ptr<Kernels::Event> compute_ready_;
  // The downloads of the last Enqueue's outputs: the next loss kernel waits for them.
  std::unique_ptr<Kernels::Event> outputs_downloaded_;
  std::unique_ptr<Kernels::Event> forward_done_;
  std::unique_ptr<Kernels::Event> gradient_done_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_MODEL_H_
