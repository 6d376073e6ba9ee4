#include "model/layer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pscluster {

// The layers, one file each under model/layers/.
const Layer* DenseLayerKind();
const Layer* Conv2DLayerKind();
const Layer* BatchNormLayerKind();
const Layer* MaxPoolLayerKind();
const Layer* GlobalAveragePoolLayerKind();
const Layer* FlattenLayerKind();
const Layer* ActivationLayerKind();
const Layer* AddLayerKind();
const Layer* AveragePoolLayerKind();

const Layer* FindLayer(v1::Layer::KindCase kind) {
  switch (kind) {
    case v1::Layer::kDense:
      return DenseLayerKind();
    case v1::Layer::kConv2D:
      return Conv2DLayerKind();
    case v1::Layer::kBatchNorm:
      return BatchNormLayerKind();
    case v1::Layer::kMaxPool:
      return MaxPoolLayerKind();
    case v1::Layer::kGlobalAveragePool:
      return GlobalAveragePoolLayerKind();
    case v1::Layer::kFlatten:
      return FlattenLayerKind();
    case v1::Layer::kActivation:
      return ActivationLayerKind();
    case v1::Layer::kAdd:
      return AddLayerKind();
    case v1::Layer::kAveragePool:
      return AveragePoolLayerKind();
    case v1::Layer::KIND_NOT_SET:
      break;
  }
  return nullptr;
}

std::string DimsString(const Dims& d) {
  return absl::StrCat("[", d.height, ", ", d.width, ", ", d.channels, "]");
}

void PlanContext::AddVariable(const std::string& name, const std::vector<int64_t>& dims,
                              const v1::InitializerSpec& initializer,
                              const v1::OptimizerSpec& optimizer) {
  v1::VariableSpec* v = spec_->add_variables();
  v->set_name(name);
  for (int64_t d : dims) v->mutable_shape()->add_dims(d);
  v->set_dtype(v1::DT_FLOAT32);
  *v->mutable_initializer() = initializer;
  *v->mutable_optimizer() = optimizer;
}

v1::InitializerSpec PlanContext::Seeded(v1::InitializerSpec::Kind kind) const {
  v1::InitializerSpec spec;
  spec.set_kind(kind);
  spec.set_seed(config_.seed());
  return spec;
}

v1::InitializerSpec PlanContext::Constant(float value) {
  v1::InitializerSpec spec;
  spec.set_kind(v1::InitializerSpec::CONSTANT);
  spec.set_value(value);
  return spec;
}

float* StepContext::Target(int t) const {
  if (t == 0 && input_grad == nullptr) return nullptr;
  if (!(*written)[t]) {
    (*written)[t] = true;
    return grad(t);
  }
  return accum;
}

void StepContext::Finish(int t, float* written_to, int64_t n) const {
  if (written_to == accum) kernels->Axpy(n, 1.0f, accum, grad(t));
}

absl::Status PlanPool2D(const v1::Pool2DLayer& p, const char* kind, const Dims& in, Node* node) {
  const int size = p.pool_size() == 0 ? 2 : p.pool_size();
  const int stride = p.stride() == 0 ? size : p.stride();
  if (size < 1 || stride < 1) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", node->name, " (", kind,
                                                   ") needs pool_size and stride >= 1, got ",
                                                   p.pool_size(), " and ", p.stride()));
  }
  absl::StatusOr<ConvGeometry> g = Window(node->name, in, size, stride, p.padding());
  if (!g.ok()) return g.status();
  node->geometry = *g;
  node->out = {g->out_h, g->out_w, in.channels};
  return absl::OkStatus();
}

Activation ToActivation(v1::ActivationKind k) {
  switch (k) {
    case v1::RELU:
      return Activation::kRelu;
    case v1::SIGMOID:
      return Activation::kSigmoid;
    case v1::TANH:
      return Activation::kTanh;
    default:
      return Activation::kLinear;
  }
}

absl::StatusOr<ConvGeometry> Window(const std::string& layer, const Dims& in, int kernel,
                                    int stride, v1::Padding padding) {
  ConvGeometry g;
  g.height = in.height;
  g.width = in.width;
  g.channels = in.channels;
  g.kernel_h = g.kernel_w = kernel;
  g.stride_h = g.stride_w = stride;
  // Larger windows or strides than the input say nothing more, and keep the arithmetic below
  // far from int's range.
  constexpr int kMaxWindow = 1 << 16;
  if (kernel > kMaxWindow || stride > kMaxWindow) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, ": window ", kernel,
                                                   " and stride ", stride, " must be at most ",
                                                   kMaxWindow));
  }
  if (padding == v1::VALID) {
    if (kernel > in.height || kernel > in.width) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", layer, ": its ", kernel, "x", kernel,
                                                     " window does not fit its ", DimsString(in),
                                                     " input with VALID padding"));
    }
    g.out_h = (in.height - kernel) / stride + 1;
    g.out_w = (in.width - kernel) / stride + 1;
    return g;
  }
  g.out_h = (in.height + stride - 1) / stride;
  g.out_w = (in.width + stride - 1) / stride;
  g.pad_top = std::max((g.out_h - 1) * stride + kernel - in.height, 0) / 2;
  g.pad_left = std::max((g.out_w - 1) * stride + kernel - in.width, 0) / 2;
  return g;
}

}  // namespace pscluster
