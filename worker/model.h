#ifndef PSCLUSTER_WORKER_MODEL_H_
#define PSCLUSTER_WORKER_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/model.pb.h"
#include "proto/model_config.pb.h"
#include "worker/kernels/kernels.h"

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
  const float* dense = nullptr;           // [size x input_dim]
  const int64_t* sparse_offsets = nullptr;  // [size + 1], or null without sparse features
  const int64_t* sparse_ids = nullptr;
  const float* labels = nullptr;          // [size]: class index, or 0/1
};

// A batch's sparse ids, deduplicated: the rows to pull, and each id's index into them.
struct SparseInput {
  std::vector<int64_t> unique_ids;
  std::vector<int32_t> row_index;  // per id of the batch, in order
  std::vector<int32_t> offsets;    // [size + 1] into row_index
};

struct StepResult {
  double loss = 0;       // mean over the batch
  int64_t correct = 0;   // classification: argmax == label; binary: (p > 0.5) == label
  // Gradients of the mean loss, per dense variable (Model::dense_variables order) and per
  // table (Model::tables order, rows of SparseInput::unique_ids).
  std::vector<std::vector<float>> dense_grads;
  std::vector<std::vector<float>> row_grads;
  // Binary tasks: the predicted probability of each example (for AUC).
  std::vector<float> scores;
};

// A model's forward and backward passes on a Kernels backend. The parameters are not kept
// here: each call gets the current values (pulled from the ps tasks) and returns gradients.
// Thread-compatible.
class Model {
 public:
  // `kernels` is not owned and must outlive the model. Device buffers are sized for
  // `max_batch` examples.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const v1::ModelConfig& config,
                                                       Kernels* kernels, int max_batch);
  ~Model();

  const v1::ModelConfig& config() const { return config_; }
  const std::vector<std::string>& dense_variables() const { return dense_names_; }
  const std::vector<int64_t>& dense_sizes() const { return dense_sizes_; }
  // One per embedding layer, in config order.
  const std::vector<std::string>& tables() const { return table_names_; }
  const std::vector<int>& table_dims() const { return table_dims_; }

  // Deduplicates a batch's sparse ids (every embedding layer reads all of them).
  static void PrepareSparse(const Batch& batch, SparseInput* sparse);

  // Runs the forward pass, and the backward pass when `backward`. params[i] has
  // dense_sizes()[i] floats; rows[t] has sparse.unique_ids.size() * table_dims()[t] floats.
  // INVALID_ARGUMENT for a batch larger than max_batch or a label out of range.
  absl::Status Compute(const Batch& batch, const SparseInput& sparse,
                       const std::vector<const float*>& params,
                       const std::vector<const float*>& rows, bool backward, StepResult* result);

 private:
  struct Layer {
    int in = 0;
    int units = 0;
    Activation activation = Activation::kLinear;
    float* kernel = nullptr;   // device parameters and gradients
    float* bias = nullptr;
    float* dkernel = nullptr;
    float* dbias = nullptr;
    float* out = nullptr;      // [max_batch x units]
    float* dout = nullptr;
  };
  struct Embedding {
    int dim = 0;
    bool mean = false;
    bool wide = false;
    int col = 0;  // column of its output in the first layer's input
  };

  Model(v1::ModelConfig config, Kernels* kernels, int max_batch);
  absl::Status Allocate();
  absl::StatusOr<float*> Floats(int64_t n);
  // Grows a per-step device buffer to hold n elements.
  absl::Status Reserve(std::vector<float*>* buffers, std::vector<int64_t>* capacity, size_t i,
                       int64_t n);

  const v1::ModelConfig config_;
  Kernels* const kernels_;  // Not owned.
  const int max_batch_;
  int input_width_ = 0;  // dense features plus concatenated embeddings
  std::vector<std::string> dense_names_;
  std::vector<int64_t> dense_sizes_;
  std::vector<std::string> table_names_;
  std::vector<int> table_dims_;
  std::vector<Layer> layers_;
  std::vector<Embedding> embeddings_;
  std::vector<void*> owned_;  // every device allocation
  float* x0_ = nullptr;       // [max_batch x input_width]
  float* dx0_ = nullptr;
  float* labels_ = nullptr;
  int32_t* int_labels_ = nullptr;
  int32_t* predictions_ = nullptr;
  float* loss_ = nullptr;
  float* wide_out_ = nullptr;
  std::vector<float*> rows_, drows_;
  std::vector<int64_t> rows_capacity_, drows_capacity_;
  int32_t* row_index_ = nullptr;
  int64_t row_index_capacity_ = 0;
  int32_t* offsets_ = nullptr;
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_MODEL_H_
