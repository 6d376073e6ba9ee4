#ifndef PSCLUSTER_MODEL_MODEL_H_
#define PSCLUSTER_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "proto/model.pb.h"
#include "proto/model_config.pb.h"

namespace pscluster {

struct Dims;        // a tensor's shape per example (model/layer.h)
struct Node;        // one layer of a network (model/layer.h)
class StepContext;  // a step's buffers, for the layers (model/layer.h)

// The variables and tables a config needs on the ps tasks, in the order the network reads them:
// for each dense layer L, "L/kernel" [in, units] and "L/bias" [units]; for a convolution C,
// "C/kernel" [k, k, in_channels, filters] (and "C/bias" [filters]); for a batch normalization
// B, "B/gamma", "B/beta", "B/moving_mean" and "B/moving_variance" [channels] (the last two
// under the moving_average optimizer: see BatchNormLayer); for each embedding layer, its table.
// Layers get the config's optimizer and seed unless they name their own. INVALID_ARGUMENT for a
// config that cannot be built, naming the layer: no layers, units < 1, a last layer that is not
// linear, a sigmoid loss with more than one output, a wide layer whose dim is not the output
// size, duplicate names, shapes that do not fit (a window larger than its input, a dense layer
// on an image without flatten, an addition of different shapes), an output nobody reads.
absl::StatusOr<v1::ModelSpec> ModelSpecFromConfig(const v1::ModelConfig& config);

// Whether a config has a network to train (`layers` or `network`); one without is a model of
// embedding tables only, which nothing trains.
bool HasNetwork(const v1::ModelConfig& config);

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
  // `max_batch` examples. `keep_patches`: each convolution keeps the patches its forward pass
  // gathered (Im2Col) in a buffer of its own for its backward pass, instead of gathering them
  // again there into one buffer all share: less work per training step for more memory (each
  // convolution's PatchFloats per example; ResNet-20: ~4.6 MB), which a GPU worker has.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const v1::ModelConfig& config,
                                                       Kernels* kernels, int max_batch,
                                                       bool keep_patches = false);
  ~Model();

  // About the device memory Create allocates per example of max_batch, in bytes: each layer's
  // output and its gradient, convolution patches, pooling indices and the inputs (not the
  // parameters, nor buffers that grow with a batch's embedding rows). Lets a caller size a
  // batch to a memory budget. INVALID_ARGUMENT as ModelSpecFromConfig.
  static absl::StatusOr<int64_t> DeviceBytesPerExample(const v1::ModelConfig& config);

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
  // The dense variables in groups that the forward pass reads in order (Hooks::before_layer):
  // group g is variables [group_first(g), group_first(g + 1)), contiguous in the packed order.
  // A `layers` config has a group per layer; a `network` one merges consecutive layers into
  // about eight groups of similar size, so that pulling them layer by layer stays a few
  // requests.
  int num_groups() const { return static_cast<int>(group_first_.size()) - 1; }
  int group_first(int g) const { return group_first_[g]; }

  // Deduplicates a batch's sparse ids (every embedding layer reads all of them).
  static void PrepareSparse(const Batch& batch, SparseInput* sparse);

  // What a step computes.
  enum class Pass {
    kInference,        // forward; batch normalization uses the moving statistics
    kTrainingForward,  // forward as in training (batch statistics), no gradients
    kTraining,         // forward and backward, with the moving statistics' updates
  };

  // Runs `pass` with host parameters: params[i] has dense_sizes()[i] floats; rows[t] has
  // sparse.unique_ids.size() * table_dims()[t] floats. Waits for the device. INVALID_ARGUMENT
  // for a batch larger than max_batch or a label out of range.
  absl::Status Compute(const Batch& batch, const SparseInput& sparse,
                       const std::vector<const float*>& params,
                       const std::vector<const float*>& rows, Pass pass, StepResult* result);
  // kTraining when `backward`, else kInference.
  absl::Status Compute(const Batch& batch, const SparseInput& sparse,
                       const std::vector<const float*>& params,
                       const std::vector<const float*>& rows, bool backward, StepResult* result) {
    return Compute(batch, sparse, params, rows, backward ? Pass::kTraining : Pass::kInference,
                   result);
  }

  // ---- The overlapped path ----

  // Copies `batch` (and its sparse ids) into staging slot `slot` and starts the upload. Waits
  // (host side) until the slot's previous upload has completed, and makes the upload wait
  // until the compute stream is done with the slot's previous batch. INVALID_ARGUMENT as
  // Compute, before anything is copied. The batch's memory may be reused when it returns.
  absl::Status StageInputs(int slot, const Batch& batch, const SparseInput& sparse);
  // As StageInputs for a model without embedding tables, with the batch gathered straight from
  // a dataset into the staging area: examples positions[0..n) of `dense` ([examples x
  // input_dim]) and `labels`. With the config's augmentation and a nonzero `augment_key` (the
  // training step), each image is shifted and flipped at random as it is copied, the draws a
  // function of the seed, the key and its position. FAILED_PRECONDITION for a model with tables.
  absl::Status StageGathered(int slot, const float* dense, const float* labels,
                             const int64_t* positions, int n, uint64_t augment_key = 0);

  // Keeps a copy of a dataset ([n x input_dim] features, n labels) in device memory, so that
  // StageGathered, given these same host arrays and no augmentation, uploads only the batch's
  // positions and gathers the batch on the device (Kernels::GatherRows) instead of copying it
  // on the host and uploading it. The CPU backend reads the host arrays in place (labels are
  // converted). The arrays must outlive the model and stay unchanged. FAILED_PRECONDITION for a
  // model with tables or an augmentation (those batches are made on the host), INVALID_ARGUMENT
  // for a label out of range (naming the example), RESOURCE_EXHAUSTED when the device has no
  // room (the caller may go on without).
  absl::Status SetResidentData(const float* dense, const float* labels, int64_t n);

  // What StageGathered does to each image: writes example `position`'s image, augmented for
  // `key` as the config's augmentation says, to `out` (input_dim floats laid out as
  // input_shape). REQUIRES: the config has an augmentation.
  void Augment(const float* image, int64_t position, uint64_t key, float* out) const;

  // Where Enqueue tells the caller what it reached.
  struct Hooks {
    // Before the first kernel that reads group g's parameters (g = 0, 1, ...; num_groups()):
    // the caller makes the compute stream wait for their upload.
    std::function<void(int group)> before_layer;
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

  // Issues `pass` on the batch staged in `slot`: forward, the loss, and backward for kTraining,
  // with dense parameters params[i] and table rows rows[t] in device memory. `gradient_scale`
  // multiplies every gradient (towers: a tower's share of the whole batch). Does not wait for
  // the device.
  absl::Status Enqueue(int slot, const std::vector<const float*>& params,
                       const std::vector<const float*>& rows, Pass pass, float gradient_scale,
                       const Hooks& hooks, const Outputs& outputs);

  // Whether Enqueue replays a step's kernels from a graph (Kernels::BeginCapture) instead of
  // launching them one by one, where it can: a backend that captures, a model without tables,
  // and no hooks (the caller orders nothing inside the step). A step of a new shape (slot,
  // batch size, pass, parameter buffers, gradient scale) runs as usual the first time and is
  // captured the second; from then on it is one launch, reading the parameter and input buffers
  // as they are when it runs. At most kMaxGraphs shapes are kept; others run as usual. A capture
  // that fails turns it off (logged). Off by default; on is ignored where it cannot apply.
  void set_capture(bool on);
  bool capture() const { return capture_; }
  // Steps run as one launch of a captured graph so far.
  int64_t graph_launches() const { return graph_launches_; }
  static constexpr size_t kMaxGraphs = 8;

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
  friend absl::StatusOr<v1::ModelSpec> ModelSpecFromConfig(const v1::ModelConfig& config);

  // An activation (node output) and its gradient, [max_batch x size].
  struct Tensor {
    int64_t size = 0;
    float* value = nullptr;  // tensor 0: the staged input's, per slot
    float* grad = nullptr;
  };
  struct Embedding {
    int dim = 0;
    bool mean = false;
    bool wide = false;
    int col = 0;  // column of its output in the input
  };
  // What ModelSpecFromConfig and Create both need: the spec, the nodes and the tensors' sizes
  // per example.
  struct Plan {
    v1::ModelSpec spec;
    std::vector<Node> nodes;
    std::vector<int64_t> tensor_sizes;
    std::vector<int> group_first;
  };
  static absl::StatusOr<Plan> MakePlan(const v1::ModelConfig& config);
  // MakePlan's parts: the input's checks; the tables (returns the flat input's width, the
  // dense features and the concatenated embeddings); a `layers` chain or a `network` graph
  // from the input of shape `input` (names: every name taken so far); the network's groups.
  static absl::Status CheckInput(const v1::ModelConfig& config);
  static absl::StatusOr<int> PlanTables(const v1::ModelConfig& config, Plan* plan,
                                        std::set<std::string>* names);
  static absl::Status PlanChain(const v1::ModelConfig& config, const Dims& input, Plan* plan,
                                std::set<std::string>* names);
  static absl::Status PlanNetwork(const v1::ModelConfig& config, const Dims& input, Plan* plan,
                                  std::set<std::string>* names);
  // The tensors network layer `l` (number `index`, `name`) reads and their shapes; marks the
  // layers it reads in `read`.
  static absl::Status NetworkInputs(const v1::Layer& l, int index, const std::string& name,
                                    const Dims& input, const Plan& plan,
                                    const std::map<std::string, int>& node_of,
                                    std::vector<bool>* read, std::vector<int>* sources,
                                    std::vector<Dims>* shapes);
  static void GroupVariables(Plan* plan);

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
    int32_t* host_positions = nullptr;    // [max_batch]: a resident batch's rows
    // Device.
    float* x0 = nullptr;  // [max_batch x input_width]
    float* labels = nullptr;
    int32_t* int_labels = nullptr;
    int32_t* row_index = nullptr;
    int64_t row_index_capacity = 0;
    int32_t* offsets = nullptr;
    int32_t* positions = nullptr;
    bool resident = false;     // the batch is gathered from the resident data by Enqueue
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
  // Enqueue's kernels, from the batch in the slot's device inputs to the gradients. `outputs`
  // null: the step is being captured, so only compute methods are called (the caller waits,
  // downloads and records around the graph).
  absl::Status EnqueueSteps(int slot, const std::vector<const float*>& params,
                            const std::vector<const float*>& rows, Pass pass, float gradient_scale,
                            const Hooks& hooks, const Outputs* outputs);
  // EnqueueSteps' parts: the batch through the network to the logits; the loss, its gradient
  // and the outputs (into the slot's StepOutputs); the gradients back from the logits.
  void Forward(int slot, const std::vector<const float*>& rows, const Hooks& hooks,
               const StepContext& ctx);
  void Loss(int slot);
  absl::Status Backward(int slot, const Hooks& hooks, const StepContext& ctx);
  // Launches the captured step of this shape (true), captures and launches it (true), or leaves
  // the step to EnqueueSteps (false: its first sighting, no room, or the capture failed).
  absl::StatusOr<bool> Replay(int slot, const std::vector<const float*>& params, Pass pass,
                              float gradient_scale);
  // Downloads the slot's loss and predictions (or logits) into `outputs` after the compute
  // stream's work so far.
  void DownloadOutputs(int slot, const Outputs& outputs);
  // Checks a label against the loss: INVALID_ARGUMENT naming the example.
  absl::Status CheckLabel(float y, int64_t example) const;
  // Checks labels against the loss: INVALID_ARGUMENT naming the example.
  absl::Status CheckLabels(const Batch& batch) const;
  // Grows a device buffer to hold n elements.
  absl::Status Reserve(float** buffer, int64_t* capacity, int64_t n);
  // Compute's steps: its host outputs and event, made once; the loss, the predictions or
  // scores, and after a training pass the gradients, read into `result`.
  absl::Status AllocateComputeOutputs();
  void ReadComputeResult(const Batch& batch, bool backward, int64_t num_rows, StepResult* result);

  const v1::ModelConfig config_;
  Kernels* const kernels_;  // Not owned.
  const int max_batch_;
  bool keep_patches_ = false;     // Create's keep_patches
  int input_width_ = 0;           // dense features plus concatenated embeddings
  int classes_ = 0;               // the logits' width
  bool need_input_grad_ = false;  // a table's rows feed the input
  std::vector<std::string> dense_names_;
  std::vector<int64_t> dense_sizes_;
  std::vector<int64_t> dense_offsets_;
  int64_t dense_total_ = 0;
  std::vector<std::string> table_names_;
  std::vector<int> table_dims_;
  std::vector<int> group_first_;
  std::vector<Node> nodes_;
  std::vector<Tensor> tensors_;
  // The tensors' values and gradients by index, for the layers (StepContext); 0 is the input's.
  std::vector<float*> tensor_values_;
  std::vector<float*> tensor_grads_;
  std::vector<Embedding> embeddings_;
  // SetResidentData: the host arrays it was given, and the device copy (features, and labels
  // as int32 classes or float 0/1).
  const float* resident_host_ = nullptr;
  int64_t resident_n_ = 0;
  const float* resident_dense_ = nullptr;
  const void* resident_labels_ = nullptr;
  std::vector<int32_t> resident_host_labels_;  // CPU backend: the converted labels
  std::vector<void*> owned_;                   // every device allocation
  std::vector<void*> owned_host_;
  Inputs inputs_[kInputSlots];
  float* grads_ = nullptr;  // packed dense gradients
  float* dx0_ = nullptr;
  float* cols_ = nullptr;   // Im2Col's output, and the gradient of it in backward
  float* accum_ = nullptr;  // a gradient for a tensor that already has one, added after
  // Per input slot: a step's loss and predictions (softmax) or a copy of its logits (sigmoid)
  // on the device, and the event of their download, which the slot's next step waits for.
  struct StepOutputs {
    float* loss = nullptr;
    int32_t* predictions = nullptr;
    float* logits = nullptr;
    std::unique_ptr<Kernels::Event> downloaded;
  };
  StepOutputs step_outputs_[kInputSlots];
  // Captured steps (set_capture), by shape; a null graph: seen once, captured next time.
  struct GraphKey {
    int slot = 0;
    int size = 0;
    bool resident = false;
    Pass pass = Pass::kTraining;
    float gradient_scale = 1.0f;
    std::vector<const float*> params;
    bool operator==(const GraphKey& o) const {
      return slot == o.slot && size == o.size && resident == o.resident && pass == o.pass &&
             gradient_scale == o.gradient_scale && params == o.params;
    }
  };
  struct CapturedStep {
    GraphKey key;
    std::unique_ptr<Kernels::Graph> graph;
  };
  bool capture_ = false;
  std::vector<CapturedStep> graphs_;
  int64_t graph_launches_ = 0;
  float* wide_out_ = nullptr;
  std::vector<float*> drows_;
  std::vector<int64_t> drows_capacity_;
  // Compute(): device copies of the host parameters and rows, and host outputs.
  float* compute_params_ = nullptr;
  std::vector<float*> compute_rows_;
  std::vector<int64_t> compute_rows_capacity_;
  Outputs compute_outputs_;
  std::unique_ptr<Kernels::Event> compute_ready_;
  std::unique_ptr<Kernels::Event> forward_done_;
  std::unique_ptr<Kernels::Event> gradient_done_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_MODEL_H_
