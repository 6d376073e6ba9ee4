// average_pool: the mean of each window, per channel, over its positions inside the input
// (TensorFlow's avg_pool); backward spreads each window's gradient evenly over them.
#include "model/layer.h"

namespace pscluster {
namespace {

class AveragePoolLayer final : public Layer {
 public:
  const char* kind() const override { return "average_pool"; }

  absl::Status Plan(const v1::Layer& config, const std::vector<Dims>& inputs, PlanContext* /*ctx*/,
                    Node* node) const override {
    return PlanPool2D(config.average_pool(), kind(), inputs[0], node);
  }

  void Forward(const StepContext& ctx, Node& node) const override {
    ConvGeometry g = node.geometry;
    g.batch = ctx.batch;
    ctx.kernels->AvgPoolForward(g, ctx.value(node.inputs[0]), ctx.value(node.output));
  }

  void Backward(const StepContext& ctx, Node& node) const override {
    ConvGeometry g = node.geometry;
    g.batch = ctx.batch;
    if (float* dx = ctx.Target(node.inputs[0])) {
      ctx.kernels->AvgPoolBackward(g, ctx.grad(node.output), dx);
      ctx.Finish(node.inputs[0], dx, ctx.batch * node.in.size());
    }
  }
};

}  // namespace

const Layer* AveragePoolLayerKind() {
  static const AveragePoolLayer layer;
  return &layer;
}

}  // namespace pscluster
