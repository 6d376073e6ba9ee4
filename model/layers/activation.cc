// activation: relu, sigmoid or tanh as a layer of its own.
#include "model/layer.h"

namespace pscluster {
namespace {

class ActivationLayer final : public Layer {
 public:
  const char* kind() const override { return "activation"; }

  absl::Status Plan(const v1::Layer& config, const std::vector<Dims>& /*inputs*/,
                    PlanContext* /*ctx*/, Node* node) const override {
    node->activation = ToActivation(config.activation().activation());
    return absl::OkStatus();
  }
  bool is_activation() const override { return true; }

  void Forward(const StepContext& ctx, Node& node) const override {
    ctx.kernels->ActivationForward(node.activation, ctx.value(node.inputs[0]),
                                   ctx.batch * node.out.size(), ctx.value(node.output));
  }

  void Backward(const StepContext& ctx, Node& node) const override {
    if (float* dx = ctx.Target(node.inputs[0])) {
      const int64_t n = ctx.batch * node.out.size();
      ctx.kernels->ActivationBackward(node.activation, ctx.value(node.output),
                                      ctx.grad(node.output), n, dx);
      ctx.Finish(node.inputs[0], dx, ctx.batch * node.in.size());
    }
  }
};

}  // namespace

const Layer* ActivationLayerKind() {
  static const ActivationLayer layer;
  return &layer;
}

}  // namespace pscluster
