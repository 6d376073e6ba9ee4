#ifndef PSCLUSTER_MODEL_LAYER_H_
#define PSCLUSTER_MODEL_LAYER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "proto/model.pb.h"
#include "proto/model_config.pb.h"

namespace pscluster {

class Layer;

// A tensor's shape per example: [height, width, channels]; a flat vector is [1, 1, n].
struct Dims {
  int height = 1;
  int width = 1;
  int channels = 0;
  int64_t size() const { return int64_t{height} * width * channels; }
  bool flat() const { return height == 1 && width == 1; }
};

// "[h, w, c]", for errors.
std::string DimsString(const Dims& d);

// One layer of a model's network, as planned from its config (Model::MakePlan).
struct Node {
  const Layer* layer = nullptr;  // its kind
  std::string name;
  std::vector<int> inputs;  // tensors read (0: the model's input)
  int output = 0;           // the tensor written; a flatten's is its input's (no copy)
  Dims in;                  // of inputs[0]
  Dims out;
  // Applied to the output after the layer's own work (dense, conv2d, add), or the layer's work
  // itself (activation).
  Activation activation = Activation::kLinear;
  bool use_bias = false;  // conv2d
  ConvGeometry geometry;  // conv2d and max_pool; batch set per step
  float momentum = 0;     // batch_norm
  float epsilon = 0;
  int first_variable = -1;  // its dense variables, contiguous
  int num_variables = 0;
  int group = -1;  // parameter group, when its first node
  // Device buffers (Layer::Allocate).
  float* mean = nullptr;  // batch_norm: the batch's statistics [channels]
  float* variance = nullptr;
  int32_t* argmax = nullptr;  // max_pool: [max_batch x out.size()]
  // conv2d under Model::Create's keep_patches: its forward pass's patches, which its backward
  // pass reads [max_batch x PatchFloats]; null: StepContext::cols, gathered again in backward.
  float* patches = nullptr;
};

// What a layer's planning adds to: the model's variables, in the order the network reads them.
class PlanContext {
 public:
  PlanContext(const v1::ModelConfig& config, v1::ModelSpec* spec) : config_(config), spec_(spec) {}

  const v1::ModelConfig& config() const { return config_; }
  int num_variables() const { return spec_->variables_size(); }
  void AddVariable(const std::string& name, const std::vector<int64_t>& dims,
                   const v1::InitializerSpec& initializer, const v1::OptimizerSpec& optimizer);
  // An initializer of `kind` seeded with the config's seed.
  v1::InitializerSpec Seeded(v1::InitializerSpec::Kind kind) const;
  static v1::InitializerSpec Constant(float value);
  // The layer's own optimizer, else the config's.
  template <typename LayerConfig>
  const v1::OptimizerSpec& OptimizerOf(const LayerConfig& l) const {
    return l.has_optimizer() ? l.optimizer() : config_.optimizer();
  }

 private:
  const v1::ModelConfig& config_;
  v1::ModelSpec* const spec_;
};

// One step's view of the model's buffers for a layer's forward and backward passes, issued on
// `kernels`' compute stream.
class StepContext {
 public:
  Kernels* kernels = nullptr;
  int batch = 0;
  bool training = false;
  float gradient_scale = 1.0f;
  const float* const* params = nullptr;  // every dense variable, in the packed order
  float* grads = nullptr;                // the packed gradient
  const int64_t* grad_offsets = nullptr;
  float* cols = nullptr;   // Im2Col's buffer (Layer::PatchFloats)
  float* accum = nullptr;  // a gradient for a tensor that already has one
  float* input = nullptr;  // tensor 0: the slot's input, and its gradient (or null)
  float* input_grad = nullptr;
  const std::vector<float*>* values = nullptr;  // tensors 1.. (index 0 unused)
  const std::vector<float*>* gradients = nullptr;
  std::vector<bool>* written = nullptr;  // backward: which tensors' gradients are written

  float* value(int t) const { return t == 0 ? input : (*values)[t]; }
  float* grad(int t) const { return t == 0 ? input_grad : (*gradients)[t]; }
  // The node's variables and their gradients.
  const float* const* weights(const Node& n) const {
    return n.num_variables > 0 ? params + n.first_variable : nullptr;
  }
  float* weight_grad(const Node& n, int i) const {
    return grads + grad_offsets[n.first_variable + i];
  }
  // Backward: where a layer writes the gradient of tensor t; null when nobody needs it (the
  // model's input without tables feeding it). The first writer of a tensor writes it in place;
  // later ones (a tensor read twice) write accum, which Finish adds.
  float* Target(int t) const;
  void Finish(int t, float* written_to, int64_t n) const;
};

// One kind of layer (a case of v1::Layer's `kind`): its checks and shapes at plan time, the
// device buffers it needs beyond its output, and its forward and backward passes. Stateless: one
// object per kind serves every node of it (FindLayer). Adding a kind is a file with a Layer
// and a line in layer.cc's registry.
class Layer {
 public:
  virtual ~Layer() = default;
  // "conv2d", as in the config, for errors.
  virtual const char* kind() const = 0;

  // Checks the config's layer and fills `node` (its inputs, name and `in`, the first input's
  // shape, are set): out, activation, geometry, variables (added to `ctx`). `inputs`: the shape
  // of every tensor it reads. INVALID_ARGUMENT naming the layer.
  virtual absl::Status Plan(const v1::Layer& config, const std::vector<Dims>& inputs,
                            PlanContext* ctx, Node* node) const = 0;
  // Whether the output is the input itself (no tensor of its own, no work).
  virtual bool aliases_input() const { return false; }
  // Whether node.activation is the layer's own work rather than applied after it.
  virtual bool is_activation() const { return false; }

  // Per example: floats of Im2Col patches, ints of indices (device buffers of max_batch).
  virtual int64_t PatchFloats(const Node& node) const { return 0; }
  virtual int64_t IndexInts(const Node& node) const { return 0; }
  // Per node, not per example: floats of statistics.
  virtual int64_t StatFloats(const Node& node) const { return 0; }
  // Takes the node's own buffers: `ints` of max_batch * IndexInts, `stats` of StatFloats.
  virtual void Bind(Node* node, int32_t* ints, float* stats) const {}

  // Reads value(inputs) and writes value(output), without the activation applied after it.
  virtual void Forward(const StepContext& ctx, Node& node) const = 0;
  // Given grad(output) (the activation after it already undone), writes the variables'
  // gradients and, through Target/Finish, the inputs'.
  virtual void Backward(const StepContext& ctx, Node& node) const = 0;
};

// The layer of a config's kind; null when the kind is not set.
const Layer* FindLayer(v1::Layer::KindCase kind);

// Plans a dense layer reading `in` (a network's dense layers and a `layers` chain alike).
absl::Status PlanDense(const v1::DenseLayer& d, const Dims& in, PlanContext* ctx, Node* node);

// Plans a pooling window (max_pool, average_pool: `kind`) over `in`: its geometry and output.
absl::Status PlanPool2D(const v1::Pool2DLayer& p, const char* kind, const Dims& in, Node* node);

// Helpers for the layers' plans.
Activation ToActivation(v1::ActivationKind k);
// A window of `kernel` x `kernel` at `stride` over `in`, padded as TensorFlow pads
// (kernels.h's ConvGeometry). INVALID_ARGUMENT naming `layer` when it does not fit.
absl::StatusOr<ConvGeometry> Window(const std::string& layer, const Dims& in, int kernel,
                                    int stride, v1::Padding padding);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_LAYER_H_
