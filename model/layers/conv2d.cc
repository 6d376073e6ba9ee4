// conv2d: a k x k convolution over NHWC input, as Im2Col and one product with the HWIO kernel
// (a 1x1 convolution at stride 1 reads its input as the patches: no copy). Backward reads the
// patches forward gathered when the node keeps them (Model::Create's keep_patches), else
// gathers them again.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/layer.h"

namespace pscluster {
namespace {

bool DirectConv(const ConvGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 &&
         g.pad_top == 0 && g.pad_left == 0;
}

class Conv2DLayer final : public Layer {
 public:
  const char* kind() const override { return "conv2d"; }

  absl::Status Plan(const v1::Layer& config, const std::vector<Dims>& inputs, PlanContext* ctx,
                    Node* node) const override {
    const v1::Conv2DLayer& c = config.conv2d();
    const Dims& in = inputs[0];
    const int stride = c.stride() == 0 ? 1 : c.stride();
    if (c.filters() < 1 || c.kernel_size() < 1 || stride < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", node->name, " (conv2d) needs filters, kernel_size and stride >= 1, got ",
          c.filters(), ", ", c.kernel_size(), " and ", c.stride()));
    }
    PS_ASSIGN_OR_RETURN(node->geometry,
                        Window(node->name, in, c.kernel_size(), stride, c.padding()));
    node->out = {node->geometry.out_h, node->geometry.out_w, c.filters()};
    node->activation = ToActivation(c.activation());
    node->use_bias = c.use_bias();
    node->first_variable = ctx->num_variables();
    node->num_variables = c.use_bias() ? 2 : 1;
    const v1::OptimizerSpec& optimizer = ctx->OptimizerOf(c);
    ctx->AddVariable(node->name + "/kernel",
                     {c.kernel_size(), c.kernel_size(), in.channels, c.filters()},
                     c.has_kernel_initializer() ? c.kernel_initializer()
                                                : ctx->Seeded(v1::InitializerSpec::HE_NORMAL),
                     optimizer);
    if (c.use_bias()) {
      ctx->AddVariable(node->name + "/bias", {c.filters()}, v1::InitializerSpec(), optimizer);
    }
    return absl::OkStatus();
  }

  int64_t PatchFloats(const Node& node) const override {
    const ConvGeometry& g = node.geometry;
    return DirectConv(g) ? 0 : int64_t{g.out_h} * g.out_w * g.patch_size();
  }

  void Forward(const StepContext& ctx, Node& node) const override {
    ConvGeometry g = node.geometry;
    g.batch = ctx.batch;
    const float* cols = ctx.value(node.inputs[0]);
    if (!DirectConv(g)) {
      float* patches = node.patches != nullptr ? node.patches : ctx.cols;
      ctx.kernels->Im2Col(g, cols, patches);
      cols = patches;
    }
    const int m = static_cast<int>(g.output_positions());
    const int filters = node.out.channels;
    const float* const* w = ctx.weights(node);
    float* y = ctx.value(node.output);
    ctx.kernels->Gemm(false, false, m, filters, static_cast<int>(g.patch_size()), 1.0f, cols, w[0],
                      0.0f, y);
    if (node.use_bias) ctx.kernels->AddBias(w[1], m, filters, y);
  }

  void Backward(const StepContext& ctx, Node& node) const override {
    ConvGeometry g = node.geometry;
    g.batch = ctx.batch;
    const bool direct = DirectConv(g);
    const float* cols = ctx.value(node.inputs[0]);
    if (!direct && node.patches != nullptr) {
      cols = node.patches;  // as the forward pass gathered them
    } else if (!direct) {
      ctx.kernels->Im2Col(g, cols, ctx.cols);
      cols = ctx.cols;
    }
    const int m = static_cast<int>(g.output_positions());
    const int k = static_cast<int>(g.patch_size());
    const int filters = node.out.channels;
    const float* dy = ctx.grad(node.output);
    ctx.kernels->Gemm(true, false, k, filters, m, 1.0f, cols, dy, 0.0f, ctx.weight_grad(node, 0));
    if (node.use_bias) ctx.kernels->BiasGrad(dy, m, filters, ctx.weight_grad(node, 1));
    if (float* dx = ctx.Target(node.inputs[0])) {
      const float* kernel = ctx.weights(node)[0];
      if (direct) {
        ctx.kernels->Gemm(false, true, m, k, filters, 1.0f, dy, kernel, 0.0f, dx);
      } else {
        ctx.kernels->Gemm(false, true, m, k, filters, 1.0f, dy, kernel, 0.0f, ctx.cols);
        ctx.kernels->Col2Im(g, ctx.cols, dx);
      }
      ctx.Finish(node.inputs[0], dx, ctx.batch * node.in.size());
    }
  }
};

}  // namespace

const Layer* Conv2DLayerKind() {
  static const Conv2DLayer layer;
  return &layer;
}

}  // namespace pscluster
