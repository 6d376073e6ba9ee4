// add: the elementwise sum of two or more tensors of one shape (residual connections).
#include "absl/strings/str_cat.h"
#include "model/layer.h"

namespace pscluster {
namespace {

class AddLayer final : public Layer {
 public:
  const char* kind() const override { return "add"; }

  absl::Status Plan(const v1::Layer& config, const std::vector<Dims>& inputs, PlanContext* /*ctx*/,
                    Node* node) const override {
    if (inputs.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", node->name, " (add) needs at least two inputs, got ", inputs.size()));
    }
    const Dims& in = inputs[0];
    for (const Dims& d : inputs) {
      if (d.height != in.height || d.width != in.width || d.channels != in.channels) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", node->name, " (add) adds a ",
                                                       DimsString(in), " and a ", DimsString(d),
                                                       " input; they must be equal"));
      }
    }
    node->activation = ToActivation(config.add().activation());
    return absl::OkStatus();
  }

  void Forward(const StepContext& ctx, Node& node) const override {
    const int64_t n = ctx.batch * node.out.size();
    float* y = ctx.value(node.output);
    ctx.kernels->Add(n, ctx.value(node.inputs[0]), ctx.value(node.inputs[1]), y);
    for (size_t i = 2; i < node.inputs.size(); ++i) {
      ctx.kernels->Add(n, y, ctx.value(node.inputs[i]), y);
    }
  }

  void Backward(const StepContext& ctx, Node& node) const override {
    const int64_t n = ctx.batch * node.out.size();
    for (int t : node.inputs) {
      if (float* dx = ctx.Target(t)) {
        ctx.kernels->ScaleCopy(n, 1.0f, ctx.grad(node.output), dx);
        ctx.Finish(t, dx, n);
      }
    }
  }
};

}  // namespace

const Layer* AddLayerKind() {
  static const AddLayer layer;
  return &layer;
}

}  // namespace pscluster
