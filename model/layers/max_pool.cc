// max_pool: the max of each window, per channel; backward routes each output's gradient to the
// input position that held the max.
#include "model/layer.h"

namespace pscluster {
namespace {

class MaxPoolLayer final : public Layer {
 public:
  const char* kind() const override { return "max_pool"; }

  absl::Status Plan(const v1::Layer& config, const std::vector<Dims>& inputs, PlanContext* /*ctx*/,
                    Node* node) const override {
    return PlanPool2D(config.max_pool(), kind(), inputs[0], node);
  }

  int64_t IndexInts(const Node& node) const override { return node.out.size(); }
  void Bind(Node* node, int32_t* ints, float* /*stats*/) const override { node->argmax = ints; }

  void Forward(const StepContext& ctx, Node& node) const override {
    ConvGeometry g = node.geometry;
    g.batch = ctx.batch;
    ctx.kernels->MaxPoolForward(g, ctx.value(node.inputs[0]), ctx.value(node.output), node.argmax);
  }

  void Backward(const StepContext& ctx, Node& node) const override {
    ConvGeometry g = node.geometry;
    g.batch = ctx.batch;
    if (float* dx = ctx.Target(node.inputs[0])) {
      ctx.kernels->MaxPoolBackward(g, ctx.grad(node.output), node.argmax, dx);
      ctx.Finish(node.inputs[0], dx, ctx.batch * node.in.size());
    }
  }
};

}  // namespace

const Layer* MaxPoolLayerKind() {
  static const MaxPoolLayer layer;
  return &layer;
}

}  // namespace pscluster
