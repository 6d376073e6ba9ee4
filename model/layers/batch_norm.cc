// batch_norm: normalizes each channel by the batch's statistics in training (their moving
// average, kept on the ps, in inference), then scales by gamma and shifts by beta.
#include "absl/strings/str_cat.h"
#include "model/layer.h"

namespace pscluster {
namespace {

class BatchNormLayer final : public Layer {
 public:
  const char* kind() const override { return "batch_norm"; }

  absl::Status Plan(const v1::Layer& config, const std::vector<Dims>& inputs, PlanContext* ctx,
                    Node* node) const override {
    const v1::BatchNormLayer& bn = config.batch_norm();
    const Dims& in = inputs[0];
    node->momentum = bn.has_momentum() ? bn.momentum() : 0.99f;
    node->epsilon = bn.has_epsilon() ? bn.epsilon() : 0.001f;
    if (!(node->momentum >= 0.0f && node->momentum < 1.0f) || !(node->epsilon > 0.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", node->name, " (batch_norm) needs momentum in [0, 1) and epsilon > 0, got ",
          node->momentum, " and ", node->epsilon));
    }
    node->first_variable = ctx->num_variables();
    node->num_variables = 4;
    const v1::OptimizerSpec& optimizer = ctx->OptimizerOf(bn);
    v1::OptimizerSpec assign;  // the ps averages the pushed batch statistics in
    assign.mutable_moving_average()->set_momentum(node->momentum);
    ctx->AddVariable(node->name + "/gamma", {in.channels}, PlanContext::Constant(1.0f), optimizer);
    ctx->AddVariable(node->name + "/beta", {in.channels}, v1::InitializerSpec(), optimizer);
    ctx->AddVariable(node->name + "/moving_mean", {in.channels}, v1::InitializerSpec(), assign);
    ctx->AddVariable(node->name + "/moving_variance", {in.channels}, PlanContext::Constant(1.0f),
                     assign);
    return absl::OkStatus();
  }

  int64_t StatFloats(const Node& node) const override { return 2 * int64_t{node.in.channels}; }
  void Bind(Node* node, int32_t* /*ints*/, float* stats) const override {
    node->mean = stats;
    node->variance = stats + node->in.channels;
  }

  void Forward(const StepContext& ctx, Node& node) const override {
    const int64_t positions = int64_t{ctx.batch} * node.in.height * node.in.width;
    const float* const* w = ctx.weights(node);
    const float* x = ctx.value(node.inputs[0]);
    float* y = ctx.value(node.output);
    if (ctx.training) {
      ctx.kernels->BatchNormForwardTraining(x, positions, node.in.channels, w[0], w[1],
                                            node.epsilon, y, node.mean, node.variance);
    } else {
      ctx.kernels->BatchNormForwardInference(x, positions, node.in.channels, w[0], w[1], w[2], w[3],
                                             node.epsilon, y);
    }
  }

  void Backward(const StepContext& ctx, Node& node) const override {
    const int c = node.in.channels;
    const int64_t positions = int64_t{ctx.batch} * node.in.height * node.in.width;
    float* dw = ctx.weight_grad(node, 0);
    float* dx = ctx.Target(node.inputs[0]);
    // Without an input gradient to write, accum takes the (unused) dx.
    ctx.kernels->BatchNormBackward(ctx.value(node.inputs[0]), ctx.grad(node.output), positions, c,
                                   ctx.weights(node)[0], node.mean, node.variance, node.epsilon, dw,
                                   dw + c, dx != nullptr ? dx : ctx.accum);
    if (dx != nullptr) ctx.Finish(node.inputs[0], dx, ctx.batch * node.in.size());
    // The moving statistics' pushes are the batch's statistics (the ps keeps their moving
    // average: BatchNormLayer), the variance with Bessel's correction; scaled by a tower's share,
    // so that the towers' sum is their mean.
    const float bessel =
        positions > 1 ? static_cast<float>(positions) / static_cast<float>(positions - 1) : 1.0f;
    ctx.kernels->ScaleCopy(c, ctx.gradient_scale, node.mean, dw + 2 * c);
    ctx.kernels->ScaleCopy(c, ctx.gradient_scale * bessel, node.variance, dw + 3 * c);
  }
};

}  // namespace

const Layer* BatchNormLayerKind() {
  static const BatchNormLayer layer;
  return &layer;
}

}  // namespace pscluster
