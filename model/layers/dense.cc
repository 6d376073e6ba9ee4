// dense: y = x * kernel + bias, x flat [batch x in], kernel [in x units].
#include "absl/strings/str_cat.h"
#include "model/layer.h"

namespace pscluster {

absl::Status PlanDense(const v1::DenseLayer& d, const Dims& in, PlanContext* ctx, Node* node) {
  if (!in.flat()) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", node->name, " (dense) reads a ",
                                                   DimsString(in),
                                                   " input; put a flatten layer before it"));
  }
  if (d.units() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", node->name, " has ", d.units(), " units; it needs at least 1"));
  }
  node->out = Dims{1, 1, d.units()};
  node->activation = ToActivation(d.activation());
  node->first_variable = ctx->num_variables();
  node->num_variables = 2;
  const v1::OptimizerSpec& optimizer = ctx->OptimizerOf(d);
  ctx->AddVariable(node->name + "/kernel", {in.size(), d.units()},
                   d.has_kernel_initializer() ? d.kernel_initializer()
                                              : ctx->Seeded(v1::InitializerSpec::GLOROT_UNIFORM),
                   optimizer);
  ctx->AddVariable(node->name + "/bias", {d.units()}, d.bias_initializer(), optimizer);
  return absl::OkStatus();
}

namespace {

class DenseLayer final : public Layer {
 public:
  const char* kind() const override { return "dense"; }

  absl::Status Plan(const v1::Layer& config, const std::vector<Dims>& inputs, PlanContext* ctx,
                    Node* node) const override {
    const v1::DenseLayer& d = config.dense();
    if (!d.name().empty() && d.name() != node->name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", node->name, " has a dense part named ", d.name(), "; leave it empty"));
    }
    return PlanDense(d, inputs[0], ctx, node);
  }

  void Forward(const StepContext& ctx, Node& node) const override {
    const float* const* w = ctx.weights(node);
    const int units = node.out.channels;
    float* y = ctx.value(node.output);
    ctx.kernels->Gemm(false, false, ctx.batch, units, static_cast<int>(node.in.size()), 1.0f,
                      ctx.value(node.inputs[0]), w[0], 0.0f, y);
    ctx.kernels->AddBias(w[1], ctx.batch, units, y);
  }

  void Backward(const StepContext& ctx, Node& node) const override {
    const int b = ctx.batch;
    const int units = node.out.channels;
    const int in_size = static_cast<int>(node.in.size());
    const float* dy = ctx.grad(node.output);
    ctx.kernels->Gemm(true, false, in_size, units, b, 1.0f, ctx.value(node.inputs[0]), dy, 0.0f,
                      ctx.weight_grad(node, 0));
    ctx.kernels->BiasGrad(dy, b, units, ctx.weight_grad(node, 1));
    if (float* dx = ctx.Target(node.inputs[0])) {
      ctx.kernels->Gemm(false, true, b, in_size, units, 1.0f, dy, ctx.weights(node)[0], 0.0f, dx);
      ctx.Finish(node.inputs[0], dx, int64_t{b} * in_size);
    }
  }
};

}  // namespace

const Layer* DenseLayerKind() {
  static const DenseLayer layer;
  return &layer;
}

}  // namespace pscluster
