// global_average_pool: the mean of each channel over the image's positions.
#include "model/layer.h"

namespace pscluster {
namespace {

class GlobalAveragePoolLayer final : public Layer {
 public:
  const char* kind() const override { return "global_average_pool"; }

  absl::Status Plan(const v1::Layer& /*config*/, const std::vector<Dims>& inputs,
                    PlanContext* /*ctx*/, Node* node) const override {
    node->out = {1, 1, inputs[0].channels};
    return absl::OkStatus();
  }

  void Forward(const StepContext& ctx, Node& node) const override {
    ctx.kernels->GlobalAvgPoolForward(ctx.value(node.inputs[0]), ctx.batch,
                                      node.in.height * node.in.width, node.in.channels,
                                      ctx.value(node.output));
  }

  void Backward(const StepContext& ctx, Node& node) const override {
    if (float* dx = ctx.Target(node.inputs[0])) {
      ctx.kernels->GlobalAvgPoolBackward(ctx.grad(node.output), ctx.batch,
                                         node.in.height * node.in.width, node.in.channels, dx);
      ctx.Finish(node.inputs[0], dx, ctx.batch * node.in.size());
    }
  }
};

}  // namespace

const Layer* GlobalAveragePoolLayerKind() {
  static const GlobalAveragePoolLayer layer;
  return &layer;
}

}  // namespace pscluster
