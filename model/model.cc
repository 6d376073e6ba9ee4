#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

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

}  // namespace

bool HasNetwork(const v1::ModelConfig& config) {
  return config.layers_size() > 0 || config.network_size() > 0;
}

namespace {

std::string DimsString(int height, int width, int channels) {
  return absl::StrCat("[", height, ", ", width, ", ", channels, "]");
}

const char* KindName(const v1::Layer& l) {
  switch (l.kind_case()) {
    case v1::Layer::kDense:
      return "dense";
    case v1::Layer::kConv2D:
      return "conv2d";
    case v1::Layer::kBatchNorm:
      return "batch_norm";
    case v1::Layer::kMaxPool:
      return "max_pool";
    case v1::Layer::kGlobalAveragePool:
      return "global_average_pool";
    case v1::Layer::kFlatten:
      return "flatten";
    case v1::Layer::kActivation:
      return "activation";
    case v1::Layer::kAdd:
      return "add";
    default:
      return "layer";
  }
}

// A window of `kernel` x `kernel` at `stride` over an input of `height` x `width` x
// `channels`, padded as TensorFlow pads (kernels.h's ConvGeometry).
absl::StatusOr<ConvGeometry> Window(const std::string& layer, int height, int width, int channels,
                                    int kernel, int stride, v1::Padding padding) {
  ConvGeometry g;
  g.height = height;
  g.width = width;
  g.channels = channels;
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
    if (kernel > height || kernel > width) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, ": its ", kernel, "x", kernel, " window does not fit its ",
                       DimsString(height, width, channels), " input with VALID padding"));
    }
    g.out_h = (height - kernel) / stride + 1;
    g.out_w = (width - kernel) / stride + 1;
    return g;
  }
  g.out_h = (height + stride - 1) / stride;
  g.out_w = (width + stride - 1) / stride;
  g.pad_top = std::max((g.out_h - 1) * stride + kernel - height, 0) / 2;
  g.pad_left = std::max((g.out_w - 1) * stride + kernel - width, 0) / 2;
  return g;
}

// A 1x1 convolution at stride 1 reads its input as Im2Col's output: no copy.
bool DirectConv(const ConvGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 &&
         g.pad_top == 0 && g.pad_left == 0;
}

}  // namespace

absl::StatusOr<Model::Plan> Model::MakePlan(const v1::ModelConfig& config) {
  if (config.layers_size() > 0 && config.network_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", config.name(), " sets both layers and network; set one of them"));
  }
  if (!HasNetwork(config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", config.name(),
                     " has no dense layers and no network; at least one layer is needed"));
  }
  if (config.input_dim() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_dim must be >= 0, got ", config.input_dim()));
  }
  const bool image = config.has_input_shape();
  if (image) {
    const v1::ImageShape& s = config.input_shape();
    if (s.height() < 1 || s.width() < 1 || s.channels() < 1 ||
        int64_t{s.height()} * s.width() * s.channels() != config.input_dim()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input_shape ", DimsString(s.height(), s.width(), s.channels()),
                       " must have every dimension >= 1 and hold input_dim = ", config.input_dim(),
                       " features"));
    }
  }
  if (config.has_augmentation()) {
    const int max_shift = config.augmentation().max_shift();
    if (!image || config.embeddings_size() > 0) {
      return absl::InvalidArgumentError(
          "augmentation needs an image input (input_shape) and a model without embedding "
          "tables");
    }
    if (max_shift < 0 || max_shift >= config.input_shape().height() ||
        max_shift >= config.input_shape().width()) {
      return absl::InvalidArgumentError(
          absl::StrCat("augmentation.max_shift must be in [0, ",
                       std::min(config.input_shape().height(), config.input_shape().width()),
                       ") for the input's height and width, got ", max_shift));
    }
  }
  Plan plan;
  std::set<std::string> names;
  int width = config.input_dim();
  for (const v1::EmbeddingBagLayer& e : config.embeddings()) {
    if (e.dim() < 1 || e.table().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("embedding layer ", e.name(),
                                                     " needs a table and dim >= 1, got table \"",
                                                     e.table(), "\" and dim ", e.dim()));
    }
    if (!names.insert(e.table()).second) {
      return absl::InvalidArgumentError(absl::StrCat("name ", e.table(), " is used twice"));
    }
    if (!e.wide()) {
      if (image) {
        return absl::InvalidArgumentError(absl::StrCat(
            "embedding layer ", e.name(),
            " would be concatenated to an image input (input_shape); only wide embedding "
            "layers go with input_shape"));
      }
      width += e.dim();
    }
    v1::TableSpec* t = plan.spec.add_tables();
    t->set_name(e.table());
    t->set_dim(e.dim());
    if (e.has_initializer()) {
      *t->mutable_initializer() = e.initializer();
    } else {
      t->mutable_initializer()->set_kind(v1::InitializerSpec::UNIFORM);
      t->mutable_initializer()->set_min(-0.05f);
      t->mutable_initializer()->set_max(0.05f);
      t->mutable_initializer()->set_seed(config.seed());
    }
    *t->mutable_optimizer() = e.has_optimizer() ? e.optimizer() : config.optimizer();
    if (e.has_admission()) *t->mutable_admission() = e.admission();
    if (e.has_eviction()) *t->mutable_eviction() = e.eviction();
    t->set_vocabulary_size(e.vocabulary_size());
  }
  if (width < 1) {
    return absl::InvalidArgumentError(
        "the first dense layer has no inputs: input_dim is 0 and "
        "no embedding is concatenated");
  }
  Dims input;
  if (image && config.network_size() > 0) {
    input = {config.input_shape().height(), config.input_shape().width(),
             config.input_shape().channels()};
  } else {
    input.channels = width;
  }
  plan.tensor_sizes.push_back(input.size());

  auto add_variable = [&plan](const std::string& name, std::vector<int64_t> dims,
                              const v1::InitializerSpec& initializer,
                              const v1::OptimizerSpec& optimizer) {
    v1::VariableSpec* v = plan.spec.add_variables();
    v->set_name(name);
    for (int64_t d : dims) v->mutable_shape()->add_dims(d);
    v->set_dtype(v1::DT_FLOAT32);
    *v->mutable_initializer() = initializer;
    *v->mutable_optimizer() = optimizer;
  };
  auto default_initializer = [&config](v1::InitializerSpec::Kind kind) {
    v1::InitializerSpec spec;
    spec.set_kind(kind);
    spec.set_seed(config.seed());
    return spec;
  };
  auto constant = [](float value) {
    v1::InitializerSpec spec;
    spec.set_kind(v1::InitializerSpec::CONSTANT);
    spec.set_value(value);
    return spec;
  };
  // A dense layer reading tensor `source`; shared by both kinds of config.
  auto add_dense = [&](const std::string& name, const v1::DenseLayer& d, int source,
                       const Dims& in) {
    Node node;
    node.op = Op::kDense;
    node.name = name;
    node.inputs = {source};
    node.in = in;
    node.out.channels = d.units();
    node.activation = ToActivation(d.activation());
    node.first_variable = plan.spec.variables_size();
    node.num_variables = 2;
    const v1::OptimizerSpec& optimizer = d.has_optimizer() ? d.optimizer() : config.optimizer();
    add_variable(name + "/kernel", {in.size(), d.units()},
                 d.has_kernel_initializer()
                     ? d.kernel_initializer()
                     : default_initializer(v1::InitializerSpec::GLOROT_UNIFORM),
                 optimizer);
    add_variable(name + "/bias", {d.units()}, d.bias_initializer(), optimizer);
    return node;
  };

  if (config.layers_size() > 0) {
    // A chain of dense layers on the flat input.
    Dims in = input;
    int source = 0;
    for (int i = 0; i < config.layers_size(); ++i) {
      const v1::DenseLayer& l = config.layers(i);
      const std::string name = l.name().empty() ? absl::StrCat("dense_", i) : l.name();
      if (l.units() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", name, " has ", l.units(), " units; it needs at least 1"));
      }
      if (i == config.layers_size() - 1 && l.activation() != v1::LINEAR) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the last layer, ", name, ", must be linear: the loss applies softmax or sigmoid"));
      }
      if (!names.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat("name ", name, " is used twice"));
      }
      Node node = add_dense(name, l, source, Dims{1, 1, static_cast<int>(in.size())});
      node.output = static_cast<int>(plan.tensor_sizes.size());
      plan.tensor_sizes.push_back(node.out.size());
      node.group = i;
      plan.group_first.push_back(node.first_variable);
      in = node.out;
      source = node.output;
      plan.nodes.push_back(std::move(node));
    }
  } else {
    // The graph: each layer's output tensor, and whether a later layer reads it.
    std::map<std::string, int> node_of;  // layer name -> node index
    std::vector<bool> read(config.network_size(), false);
    for (int i = 0; i < config.network_size(); ++i) {
      const v1::Layer& l = config.network(i);
      const std::string name = l.name().empty() ? absl::StrCat(KindName(l), "_", i) : l.name();
      if (l.kind_case() == v1::Layer::KIND_NOT_SET) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", name, " (network index ", i,
                         ") has no kind: set one of dense, conv2d, batch_norm, max_pool, "
                         "global_average_pool, flatten, activation, add"));
      }
      if (name == "input" || !names.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "name ", name,
            name == "input" ? " is reserved for the model's input" : " is used twice"));
      }
      // The tensors it reads, and their shapes.
      std::vector<int> sources;
      std::vector<Dims> shapes;
      auto read_node = [&](int n) {
        sources.push_back(plan.nodes[n].output);
        shapes.push_back(plan.nodes[n].out);
        read[n] = true;
      };
      if (l.inputs().empty()) {
        if (i == 0) {
          sources.push_back(0);
          shapes.push_back(input);
        } else {
          read_node(i - 1);
        }
      }
      for (const std::string& from : l.inputs()) {
        if (from == "input") {
          sources.push_back(0);
          shapes.push_back(input);
          continue;
        }
        auto it = node_of.find(from);
        if (it == node_of.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("layer ", name, " reads \"", from,
                           "\", which is not an earlier layer of the network nor \"input\""));
        }
        read_node(it->second);
      }
      if (l.kind_case() != v1::Layer::kAdd && sources.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", name, " (", KindName(l),
                                                       ") reads ", sources.size(),
                                                       " inputs; only add reads more than one"));
      }
      const Dims in = shapes[0];
      const std::string in_string = DimsString(in.height, in.width, in.channels);
      Node node;
      node.name = name;
      node.inputs = sources;
      node.in = in;
      node.out = in;
      switch (l.kind_case()) {
        case v1::Layer::kDense: {
          const v1::DenseLayer& d = l.dense();
          if (!d.name().empty() && d.name() != name) {
            return absl::InvalidArgumentError(absl::StrCat(
                "layer ", name, " has a dense part named ", d.name(), "; leave it empty"));
          }
          if (!in.flat()) {
            return absl::InvalidArgumentError(
                absl::StrCat("layer ", name, " (dense) reads a ", in_string,
                             " input; put a flatten layer before it"));
          }
          if (d.units() < 1) {
            return absl::InvalidArgumentError(
                absl::StrCat("layer ", name, " has ", d.units(), " units; it needs at least 1"));
          }
          node = add_dense(name, d, sources[0], in);
          break;
        }
        case v1::Layer::kConv2D: {
          const v1::Conv2DLayer& c = l.conv2d();
          const int stride = c.stride() == 0 ? 1 : c.stride();
          if (c.filters() < 1 || c.kernel_size() < 1 || stride < 1) {
            return absl::InvalidArgumentError(absl::StrCat(
                "layer ", name, " (conv2d) needs filters, kernel_size and stride >= 1, got ",
                c.filters(), ", ", c.kernel_size(), " and ", c.stride()));
          }
          PS_ASSIGN_OR_RETURN(node.geometry, Window(name, in.height, in.width, in.channels,
                                                    c.kernel_size(), stride, c.padding()));
          node.op = Op::kConv2D;
          node.out = {node.geometry.out_h, node.geometry.out_w, c.filters()};
          node.activation = ToActivation(c.activation());
          node.use_bias = c.use_bias();
          node.first_variable = plan.spec.variables_size();
          node.num_variables = c.use_bias() ? 2 : 1;
          const v1::OptimizerSpec& optimizer =
              c.has_optimizer() ? c.optimizer() : config.optimizer();
          add_variable(
              name + "/kernel", {c.kernel_size(), c.kernel_size(), in.channels, c.filters()},
              c.has_kernel_initializer() ? c.kernel_initializer()
                                         : default_initializer(v1::InitializerSpec::HE_NORMAL),
              optimizer);
          if (c.use_bias()) {
            add_variable(name + "/bias", {c.filters()}, v1::InitializerSpec(), optimizer);
          }
          break;
        }
        case v1::Layer::kBatchNorm: {
          const v1::BatchNormLayer& bn = l.batch_norm();
          node.op = Op::kBatchNorm;
          node.momentum = bn.has_momentum() ? bn.momentum() : 0.99f;
          node.epsilon = bn.has_epsilon() ? bn.epsilon() : 0.001f;
          if (!(node.momentum >= 0.0f && node.momentum < 1.0f) || !(node.epsilon > 0.0f)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "layer ", name, " (batch_norm) needs momentum in [0, 1) and epsilon > 0, got ",
                node.momentum, " and ", node.epsilon));
          }
          node.first_variable = plan.spec.variables_size();
          node.num_variables = 4;
          const v1::OptimizerSpec& optimizer =
              bn.has_optimizer() ? bn.optimizer() : config.optimizer();
          v1::OptimizerSpec assign;  // the ps averages the pushed batch statistics in
          assign.mutable_moving_average()->set_momentum(node.momentum);
          add_variable(name + "/gamma", {in.channels}, constant(1.0f), optimizer);
          add_variable(name + "/beta", {in.channels}, v1::InitializerSpec(), optimizer);
          add_variable(name + "/moving_mean", {in.channels}, v1::InitializerSpec(), assign);
          add_variable(name + "/moving_variance", {in.channels}, constant(1.0f), assign);
          break;
        }
        case v1::Layer::kMaxPool: {
          const v1::Pool2DLayer& p = l.max_pool();
          const int size = p.pool_size() == 0 ? 2 : p.pool_size();
          const int stride = p.stride() == 0 ? size : p.stride();
          if (size < 1 || stride < 1) {
            return absl::InvalidArgumentError(
                absl::StrCat("layer ", name, " (max_pool) needs pool_size and stride >= 1, got ",
                             p.pool_size(), " and ", p.stride()));
          }
          PS_ASSIGN_OR_RETURN(node.geometry, Window(name, in.height, in.width, in.channels, size,
                                                    stride, p.padding()));
          node.op = Op::kMaxPool;
          node.out = {node.geometry.out_h, node.geometry.out_w, in.channels};
          break;
        }
        case v1::Layer::kGlobalAveragePool:
          node.op = Op::kGlobalAvgPool;
          node.out = {1, 1, in.channels};
          break;
        case v1::Layer::kFlatten:
          node.op = Op::kFlatten;
          node.out = {
              1, 1,
              static_cast<int>(std::min<int64_t>(in.size(), std::numeric_limits<int32_t>::max()))};
          break;
        case v1::Layer::kActivation:
          node.op = Op::kActivation;
          node.activation = ToActivation(l.activation().activation());
          break;
        case v1::Layer::kAdd:
          if (sources.size() < 2) {
            return absl::InvalidArgumentError(absl::StrCat(
                "layer ", name, " (add) needs at least two inputs, got ", sources.size()));
          }
          for (const Dims& d : shapes) {
            if (d.height != in.height || d.width != in.width || d.channels != in.channels) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "layer ", name, " (add) adds a ", in_string, " and a ",
                  DimsString(d.height, d.width, d.channels), " input; they must be equal"));
            }
          }
          node.op = Op::kAdd;
          node.activation = ToActivation(l.add().activation());
          break;
        default:
          break;
      }
      if (in.size() >= std::numeric_limits<int32_t>::max() ||
          node.out.size() >= std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", name, " has more than 2^31 - 1 floats per example in its input or output"));
      }
      if (node.op == Op::kFlatten) {
        node.output = sources[0];
      } else {
        node.output = static_cast<int>(plan.tensor_sizes.size());
        plan.tensor_sizes.push_back(node.out.size());
      }
      node_of[name] = i;
      plan.nodes.push_back(std::move(node));
    }
    for (int i = 0; i + 1 < config.network_size(); ++i) {
      if (!read[i]) {
        return absl::InvalidArgumentError(absl::StrCat("the output of layer ", plan.nodes[i].name,
                                                       " is not read by any later layer"));
      }
    }
    const Node& last = plan.nodes.back();
    if (last.op == Op::kFlatten) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the last layer, ", last.name,
          ", is a flatten; the logits must come from a layer that computes them (dense)"));
    }
    if (!last.out.flat()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the last layer, ", last.name, ", outputs ",
          DimsString(last.out.height, last.out.width, last.out.channels),
          "; the logits must be flat (end with flatten or global_average_pool and dense)"));
    }
    if (last.activation != Activation::kLinear) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the last layer, ", last.name, ", must be linear: the loss applies softmax or sigmoid"));
    }
    // Groups of about an eighth of the parameters each, in forward order.
    int64_t total = 0;
    for (const v1::VariableSpec& v : plan.spec.variables()) {
      int64_t n = 1;
      for (int64_t d : v.shape().dims()) n *= d;
      total += n;
    }
    const int64_t target = std::max<int64_t>(total / 8, 1);
    int64_t in_group = target;  // the first node with variables opens a group
    for (Node& node : plan.nodes) {
      if (node.num_variables == 0) continue;
      if (in_group >= target) {
        node.group = static_cast<int>(plan.group_first.size());
        plan.group_first.push_back(node.first_variable);
        in_group = 0;
      }
      for (int v = node.first_variable; v < node.first_variable + node.num_variables; ++v) {
        int64_t n = 1;
        for (int64_t d : plan.spec.variables(v).shape().dims()) n *= d;
        in_group += n;
      }
    }
  }
  plan.group_first.push_back(plan.spec.variables_size());
  const int out_units = static_cast<int>(plan.nodes.back().out.size());
  for (const v1::EmbeddingBagLayer& e : config.embeddings()) {
    if (e.wide() && e.dim() != out_units) {
      return absl::InvalidArgumentError(absl::StrCat("wide embedding layer ", e.name(), " has dim ",
                                                     e.dim(), "; it must equal the output size ",
                                                     out_units));
    }
  }
  if (config.loss() == v1::ModelConfig::SIGMOID_CROSS_ENTROPY && out_units != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a sigmoid cross-entropy loss needs 1 output unit, the last layer has ", out_units));
  }
  if (config.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY && out_units < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a softmax cross-entropy loss needs at least 2 classes, the last layer has ", out_units));
  }
  return plan;
}

absl::StatusOr<v1::ModelSpec> ModelSpecFromConfig(const v1::ModelConfig& config) {
  PS_ASSIGN_OR_RETURN(Model::Plan plan, Model::MakePlan(config));
  return std::move(plan.spec);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const v1::ModelConfig& config,
                                                     Kernels* kernels, int max_batch) {
  PS_ASSIGN_OR_RETURN(Plan plan, MakePlan(config));
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch must be >= 1, got ", max_batch));
  }
  auto model = std::unique_ptr<Model>(new Model(config, kernels, max_batch));
  for (const v1::VariableSpec& v : plan.spec.variables()) {
    model->dense_names_.push_back(v.name());
    int64_t n = 1;
    for (int64_t d : v.shape().dims()) n *= d;
    model->dense_offsets_.push_back(model->dense_total_);
    model->dense_sizes_.push_back(n);
    model->dense_total_ += n;
  }
  model->input_width_ = config.input_dim();
  for (const v1::EmbeddingBagLayer& e : config.embeddings()) {
    Embedding emb;
    emb.dim = e.dim();
    emb.mean = e.combiner() == v1::EmbeddingBagLayer::MEAN;
    emb.wide = e.wide();
    if (!e.wide()) {
      emb.col = model->input_width_;
      model->input_width_ += e.dim();
      model->need_input_grad_ = true;
    }
    model->embeddings_.push_back(emb);
    model->table_names_.push_back(e.table());
    model->table_dims_.push_back(e.dim());
  }
  model->nodes_ = std::move(plan.nodes);
  model->group_first_ = std::move(plan.group_first);
  for (int64_t size : plan.tensor_sizes) {
    Tensor t;
    t.size = size;
    model->tensors_.push_back(t);
  }
  model->classes_ = static_cast<int>(model->nodes_.back().out.size());
  // GEMM dimensions and max pooling's indices are 32-bit: a batch of any tensor must fit.
  for (const Node& node : model->nodes_) {
    for (const Dims& d : {node.in, node.out}) {
      if (int64_t{max_batch} * d.size() > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", node.name, " has ", d.size(), " floats per example; ", max_batch,
            " examples of it exceed 2^31 - 1, the most a batch may hold: use a smaller batch"));
      }
    }
  }
  PS_RETURN_IF_ERROR(model->Allocate());
  return model;
}

absl::StatusOr<int64_t> Model::DeviceBytesPerExample(const v1::ModelConfig& config) {
  PS_ASSIGN_OR_RETURN(const Plan plan, MakePlan(config));
  int64_t input = config.input_dim();
  for (const v1::EmbeddingBagLayer& e : config.embeddings()) input += e.dim();
  // Per input slot: the input and the labels (float and int); then its gradient (dx0_).
  int64_t words = kInputSlots * (input + 3) + input;
  int64_t largest = input;
  int64_t cols = 0;
  for (size_t t = 1; t < plan.tensor_sizes.size(); ++t) {
    words += 2 * plan.tensor_sizes[t];
    largest = std::max(largest, plan.tensor_sizes[t]);
  }
  for (const Node& node : plan.nodes) {
    if (node.op == Op::kMaxPool) words += node.out.size();
    if (node.op == Op::kConv2D && !DirectConv(node.geometry)) {
      cols = std::max(
          cols, int64_t{node.geometry.out_h} * node.geometry.out_w * node.geometry.patch_size());
    }
  }
  const int64_t classes = plan.nodes.back().out.size();
  // accum_, the patches, and per slot the loss, predictions and logits.
  words += largest + cols + kInputSlots * 3 + classes;
  return words * 4;
}

Model::Model(v1::ModelConfig config, Kernels* kernels, int max_batch)
    : config_(std::move(config)), kernels_(kernels), max_batch_(max_batch) {}

Model::~Model() {
  // Copies in flight may still read or write these buffers.
  for (Inputs& in : inputs_) {
    if (in.uploaded) kernels_->Synchronize(in.uploaded.get());
    if (in.consumed) kernels_->Synchronize(in.consumed.get());
  }
  for (const StepOutputs& o : step_outputs_) {
    if (o.downloaded) kernels_->Synchronize(o.downloaded.get());
  }
  if (gradient_done_) kernels_->Synchronize(gradient_done_.get());
  for (void* p : owned_) kernels_->Free(p);
  for (void* p : owned_host_) kernels_->FreeHost(p);
}

absl::StatusOr<float*> Model::Floats(int64_t n) {
  PS_ASSIGN_OR_RETURN(float* p, kernels_->AllocateFloats(std::max<int64_t>(n, 1)));
  owned_.push_back(p);
  return p;
}

absl::StatusOr<int32_t*> Model::Ints(int64_t n) {
  PS_ASSIGN_OR_RETURN(int32_t * p, kernels_->AllocateInts(std::max<int64_t>(n, 1)));
  owned_.push_back(p);
  return p;
}

absl::Status Model::Allocate() {
  const int64_t b = max_batch_;
  auto host = [this](int64_t bytes) -> absl::StatusOr<void*> {
    PS_ASSIGN_OR_RETURN(void* p, kernels_->AllocateHost(std::max<int64_t>(bytes, 4)));
    owned_host_.push_back(p);
    return p;
  };
  for (Inputs& in : inputs_) {
    PS_ASSIGN_OR_RETURN(in.x0, Floats(b * input_width_));
    PS_ASSIGN_OR_RETURN(in.labels, Floats(b));
    PS_ASSIGN_OR_RETURN(in.int_labels, Ints(b));
    PS_ASSIGN_OR_RETURN(in.offsets, Ints(b + 1));
    PS_ASSIGN_OR_RETURN(void* dense, host(b * config_.input_dim() * int64_t{sizeof(float)}));
    in.host_dense = static_cast<float*>(dense);
    PS_ASSIGN_OR_RETURN(void* labels, host(b * int64_t{sizeof(float)}));
    in.host_labels = static_cast<float*>(labels);
    PS_ASSIGN_OR_RETURN(void* int_labels, host(b * int64_t{sizeof(int32_t)}));
    in.host_int_labels = static_cast<int32_t*>(int_labels);
    PS_ASSIGN_OR_RETURN(void* offsets, host((b + 1) * int64_t{sizeof(int32_t)}));
    in.host_offsets = static_cast<int32_t*>(offsets);
    PS_ASSIGN_OR_RETURN(void* positions, host(b * int64_t{sizeof(int32_t)}));
    in.host_positions = static_cast<int32_t*>(positions);
    PS_ASSIGN_OR_RETURN(in.positions, Ints(b));
    in.rows.assign(embeddings_.size(), nullptr);
    in.rows_capacity.assign(embeddings_.size(), 0);
    in.uploaded = kernels_->NewEvent();
    in.consumed = kernels_->NewEvent();
  }
  PS_ASSIGN_OR_RETURN(grads_, Floats(dense_total_));
  int64_t largest = input_width_;
  for (size_t t = 1; t < tensors_.size(); ++t) {
    PS_ASSIGN_OR_RETURN(tensors_[t].value, Floats(b * tensors_[t].size));
    PS_ASSIGN_OR_RETURN(tensors_[t].grad, Floats(b * tensors_[t].size));
    largest = std::max(largest, tensors_[t].size);
  }
  int64_t cols = 0;
  for (Node& node : nodes_) {
    if (node.op == Op::kBatchNorm) {
      PS_ASSIGN_OR_RETURN(node.mean, Floats(node.in.channels));
      PS_ASSIGN_OR_RETURN(node.variance, Floats(node.in.channels));
    } else if (node.op == Op::kMaxPool) {
      PS_ASSIGN_OR_RETURN(node.argmax, Ints(b * node.out.size()));
    } else if (node.op == Op::kConv2D && !DirectConv(node.geometry)) {
      cols = std::max(cols,
                      b * node.geometry.out_h * node.geometry.out_w * node.geometry.patch_size());
    }
  }
  if (cols > 0) {
    PS_ASSIGN_OR_RETURN(cols_, Floats(cols));
  }
  PS_ASSIGN_OR_RETURN(accum_, Floats(b * largest));
  PS_ASSIGN_OR_RETURN(dx0_, Floats(b * input_width_));
  for (StepOutputs& o : step_outputs_) {
    PS_ASSIGN_OR_RETURN(o.loss, Floats(b));
    PS_ASSIGN_OR_RETURN(o.predictions, Ints(b));
    PS_ASSIGN_OR_RETURN(o.logits, Floats(b));
    o.downloaded = kernels_->NewEvent();
  }
  PS_ASSIGN_OR_RETURN(wide_out_, Floats(b * classes_));
  drows_.assign(embeddings_.size(), nullptr);
  drows_capacity_.assign(embeddings_.size(), 0);
  compute_rows_.assign(embeddings_.size(), nullptr);
  compute_rows_capacity_.assign(embeddings_.size(), 0);
  forward_done_ = kernels_->NewEvent();
  gradient_done_ = kernels_->NewEvent();
  return absl::OkStatus();
}

absl::Status Model::Reserve(float** buffer, int64_t* capacity, int64_t n) {
  if (*capacity >= n) return absl::OkStatus();
  const int64_t grown = std::max(n, 2 * *capacity);
  PS_ASSIGN_OR_RETURN(float* p, kernels_->AllocateFloats(grown));
  if (*buffer != nullptr) {
    // Work issued earlier may still use the old buffer: Free waits for the device.
    kernels_->Free(*buffer);
    owned_.erase(std::find(owned_.begin(), owned_.end(), *buffer));
  }
  owned_.push_back(p);
  *buffer = p;
  *capacity = grown;
  return absl::OkStatus();
}

absl::StatusOr<float*> Model::RowBuffer(int slot, int table, int64_t n) {
  Inputs& in = inputs_[slot];
  PS_RETURN_IF_ERROR(Reserve(&in.rows[table], &in.rows_capacity[table], n * table_dims_[table]));
  return in.rows[table];
}

void Model::PrepareSparse(const Batch& batch, SparseInput* sparse) {
  sparse->unique_ids.clear();
  sparse->row_index.clear();
  sparse->offsets.assign(1, 0);
  absl::flat_hash_map<int64_t, int32_t> index;
  for (int b = 0; b < batch.size; ++b) {
    if (batch.sparse_offsets != nullptr) {
      for (int64_t j = batch.sparse_offsets[b]; j < batch.sparse_offsets[b + 1]; ++j) {
        auto [it, inserted] =
            index.emplace(batch.sparse_ids[j], static_cast<int32_t>(sparse->unique_ids.size()));
        if (inserted) sparse->unique_ids.push_back(batch.sparse_ids[j]);
        sparse->row_index.push_back(it->second);
      }
    }
    sparse->offsets.push_back(static_cast<int32_t>(sparse->row_index.size()));
  }
}

absl::Status Model::CheckLabel(float y, int64_t example) const {
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  const bool ok = softmax ? (y >= 0 && y < classes_ && y == std::floor(y)) : (y == 0 || y == 1);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("label ", y, " of example ", example, " is out of range: expected ",
                   softmax ? absl::StrCat("a class in 0..", classes_ - 1) : std::string("0 or 1")));
}

absl::Status Model::CheckLabels(const Batch& batch) const {
  const int b = batch.size;
  if (b < 1 || b > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", b, " examples; this model takes 1 to ", max_batch_));
  }
  for (int i = 0; i < b; ++i) PS_RETURN_IF_ERROR(CheckLabel(batch.labels[i], i));
  return absl::OkStatus();
}

absl::Status Model::StageInputs(int slot, const Batch& batch, const SparseInput& sparse) {
  PS_RETURN_IF_ERROR(CheckLabels(batch));
  Inputs& in = inputs_[slot];
  const int b = batch.size;
  // The staging buffers are free once the slot's previous upload is done.
  kernels_->Synchronize(in.uploaded.get());
  const int input_dim = config_.input_dim();
  std::copy_n(batch.dense, int64_t{b} * input_dim, in.host_dense);
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  for (int i = 0; i < b; ++i) {
    if (softmax) {
      in.host_int_labels[i] = static_cast<int32_t>(batch.labels[i]);
    } else {
      in.host_labels[i] = batch.labels[i];
    }
  }
  in.resident = false;
  in.size = b;
  in.num_rows = static_cast<int64_t>(sparse.unique_ids.size());
  if (!embeddings_.empty()) {
    const int64_t ids = static_cast<int64_t>(sparse.row_index.size());
    in.host_row_index.assign(sparse.row_index.begin(), sparse.row_index.end());
    std::copy(sparse.offsets.begin(), sparse.offsets.end(), in.host_offsets);
    if (in.row_index_capacity < ids) {
      // Growing a device buffer waits for the device: rare, and only while sizes grow.
      kernels_->Synchronize(in.consumed.get());
      if (in.row_index != nullptr) {
        kernels_->Free(in.row_index);
        owned_.erase(std::find(owned_.begin(), owned_.end(), in.row_index));
      }
      in.row_index_capacity = std::max<int64_t>(ids, 2 * in.row_index_capacity);
      PS_ASSIGN_OR_RETURN(in.row_index, Ints(in.row_index_capacity));
    }
  }
  Upload(slot);
  return absl::OkStatus();
}

absl::Status Model::SetResidentData(const float* dense, const float* labels, int64_t n) {
  if (!embeddings_.empty() || config_.has_augmentation()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", config_.name(),
                     " makes its batches on the host (it has embedding tables or augments)"));
  }
  if (n < 1 || n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a resident dataset holds 1 to 2^31 - 1 examples, not ", n));
  }
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  std::vector<int32_t> classes;
  if (softmax) classes.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    PS_RETURN_IF_ERROR(CheckLabel(labels[i], i));
    if (softmax) classes[i] = static_cast<int32_t>(labels[i]);
  }
  const int64_t input_dim = config_.input_dim();
  if (kernels_->device_is_host()) {
    resident_dense_ = dense;
    resident_host_labels_ = std::move(classes);
    resident_labels_ = softmax ? static_cast<const void*>(resident_host_labels_.data()) : labels;
  } else {
    PS_ASSIGN_OR_RETURN(float* d, Floats(n * input_dim));
    kernels_->CopyToDevice(dense, d, n * input_dim);
    if (softmax) {
      PS_ASSIGN_OR_RETURN(int32_t * l, Ints(n));
      kernels_->CopyToDevice(classes.data(), l, n);
      resident_labels_ = l;
    } else {
      PS_ASSIGN_OR_RETURN(float* l, Floats(n));
      kernels_->CopyToDevice(labels, l, n);
      resident_labels_ = l;
    }
    resident_dense_ = d;
  }
  resident_host_ = dense;
  resident_n_ = n;
  return absl::OkStatus();
}

absl::Status Model::StageGathered(int slot, const float* dense, const float* labels,
                                  const int64_t* positions, int n, uint64_t augment_key) {
  if (!embeddings_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", config_.name(), " has embedding tables: stage its batches with StageInputs"));
  }
  if (n < 1 || n > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", n, " examples; this model takes 1 to ", max_batch_));
  }
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  for (int i = 0; i < n; ++i) PS_RETURN_IF_ERROR(CheckLabel(labels[positions[i]], positions[i]));
  Inputs& in = inputs_[slot];
  kernels_->Synchronize(in.uploaded.get());
  const int64_t input_dim = config_.input_dim();
  const bool augment = augment_key != 0 && config_.has_augmentation();
  if (!augment && dense == resident_host_ && resident_host_ != nullptr) {
    // Only the positions go up; Enqueue gathers the batch on the device.
    for (int i = 0; i < n; ++i) {
      if (positions[i] < 0 || positions[i] >= resident_n_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "example ", positions[i], " is not in the resident data of ", resident_n_));
      }
      in.host_positions[i] = static_cast<int32_t>(positions[i]);
    }
    in.size = n;
    in.num_rows = 0;
    in.resident = true;
    kernels_->Wait(Kernels::Stream::kUpload, in.consumed.get());
    kernels_->CopyToDeviceAsync(Kernels::Stream::kUpload, in.host_positions, in.positions,
                                int64_t{n} * 4);
    kernels_->Record(in.uploaded.get(), Kernels::Stream::kUpload);
    return absl::OkStatus();
  }
  in.resident = false;
  for (int i = 0; i < n; ++i) {
    if (augment) {
      Augment(dense + positions[i] * input_dim, positions[i], augment_key,
              in.host_dense + i * input_dim);
    } else {
      std::memcpy(in.host_dense + i * input_dim, dense + positions[i] * input_dim,
                  input_dim * sizeof(float));
    }
    if (softmax) {
      in.host_int_labels[i] = static_cast<int32_t>(labels[positions[i]]);
    } else {
      in.host_labels[i] = labels[positions[i]];
    }
  }
  in.size = n;
  in.num_rows = 0;
  Upload(slot);
  return absl::OkStatus();
}

void Model::Augment(const float* image, int64_t position, uint64_t key, float* out) const {
  const int height = config_.input_shape().height();
  const int width = config_.input_shape().width();
  const int channels = config_.input_shape().channels();
  const int max_shift = config_.augmentation().max_shift();
  // A SplitMix64 generator seeded from (seed, key, position): three independent draws.
  uint64_t state = config_.seed() ^ (key * kSplitMix64Step) ^
                   (static_cast<uint64_t>(position) * 0xC2B2AE3D27D4EB4FULL);
  auto next = [&state]() {
    const uint64_t z = SplitMix64(state);
    state += kSplitMix64Step;
    return z;
  };
  const int span = 2 * max_shift + 1;
  const int dy = static_cast<int>(next() % span) - max_shift;
  const int dx = static_cast<int>(next() % span) - max_shift;
  const bool flip = config_.augmentation().horizontal_flip() && (next() & 1) != 0;
  // out[y, x] = in[y + dy, x' + dx], x' the mirrored column when flipped; zeros outside.
  for (int y = 0; y < height; ++y) {
    float* row = out + int64_t{y} * width * channels;
    const int sy = y + dy;
    if (sy < 0 || sy >= height) {
      std::fill_n(row, int64_t{width} * channels, 0.0f);
      continue;
    }
    const float* src = image + int64_t{sy} * width * channels;
    for (int x = 0; x < width; ++x) {
      const int sx = (flip ? width - 1 - x : x) + dx;
      float* dst = row + int64_t{x} * channels;
      if (sx < 0 || sx >= width) {
        std::fill_n(dst, channels, 0.0f);
      } else {
        std::copy_n(src + int64_t{sx} * channels, channels, dst);
      }
    }
  }
}

void Model::Upload(int slot) {
  Inputs& in = inputs_[slot];
  const int b = in.size;
  const int input_dim = config_.input_dim();
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  // The device inputs are free once the compute stream is done with the slot's last batch.
  kernels_->Wait(Kernels::Stream::kUpload, in.consumed.get());
  const auto up = Kernels::Stream::kUpload;
  if (input_width_ == input_dim) {
    kernels_->CopyToDeviceAsync(up, in.host_dense, in.x0, int64_t{b} * input_dim * 4);
  } else if (input_dim > 0) {
    kernels_->CopyRowsToDeviceAsync(up, in.host_dense, int64_t{input_dim} * 4, in.x0,
                                    int64_t{input_width_} * 4, int64_t{input_dim} * 4, b);
  }
  if (softmax) {
    kernels_->CopyToDeviceAsync(up, in.host_int_labels, in.int_labels, int64_t{b} * 4);
  } else {
    kernels_->CopyToDeviceAsync(up, in.host_labels, in.labels, int64_t{b} * 4);
  }
  if (!embeddings_.empty()) {
    // The row index is ordinary memory: the copy stages it before returning.
    kernels_->CopyToDeviceAsync(up, in.host_row_index.data(), in.row_index,
                                static_cast<int64_t>(in.host_row_index.size()) * 4);
    kernels_->CopyToDeviceAsync(up, in.host_offsets, in.offsets, int64_t{b + 1} * 4);
  }
  kernels_->Record(in.uploaded.get(), up);
}

void Model::set_capture(bool on) { capture_ = on && kernels_->can_capture(); }

absl::Status Model::Enqueue(int slot, const std::vector<const float*>& params,
                            const std::vector<const float*>& rows, Pass pass, float gradient_scale,
                            const Hooks& hooks, const Outputs& outputs) {
  if (params.size() != dense_names_.size() || rows.size() != embeddings_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", params.size(), " dense variables and ", rows.size(),
                     " tables; the model has ", dense_names_.size(), " and ", embeddings_.size()));
  }
  Inputs& in = inputs_[slot];
  if (in.size < 1) {
    return absl::FailedPreconditionError(absl::StrCat("input slot ", slot, " is empty"));
  }
  const auto compute = Kernels::Stream::kCompute;
  kernels_->Wait(compute, in.uploaded.get());
  const bool hooked =
      hooks.before_layer || hooks.before_backward || hooks.gradient_ready || hooks.reduce_gradients;
  if (capture_ && !hooked && embeddings_.empty()) {
    // The outputs of the step that last used this slot must be on the host before the graph
    // writes them again.
    kernels_->Wait(compute, step_outputs_[slot].downloaded.get());
    PS_ASSIGN_OR_RETURN(const bool replayed, Replay(slot, params, pass, gradient_scale));
    if (replayed) {
      DownloadOutputs(slot, outputs);
      kernels_->Record(in.consumed.get(), compute);
      kernels_->Record(gradient_done_.get(), compute);
      return absl::OkStatus();
    }
  }
  return EnqueueSteps(slot, params, rows, pass, gradient_scale, hooks, &outputs);
}

absl::StatusOr<bool> Model::Replay(int slot, const std::vector<const float*>& params, Pass pass,
                                   float gradient_scale) {
  const Inputs& in = inputs_[slot];
  GraphKey key;
  key.slot = slot;
  key.size = in.size;
  key.resident = in.resident;
  key.pass = pass;
  key.gradient_scale = gradient_scale;
  key.params = params;
  auto it = std::find_if(graphs_.begin(), graphs_.end(),
                         [&key](const CapturedStep& c) { return c.key == key; });
  if (it != graphs_.end() && it->graph != nullptr) {
    kernels_->Launch(it->graph.get());
    ++graph_launches_;
    return true;
  }
  if (it == graphs_.end()) {
    // A shape's first step runs as usual: it grows what it needs (cuBLAS's choices, the
    // reductions' scratch) outside a capture. The second is captured.
    if (graphs_.size() < kMaxGraphs) {
      graphs_.emplace_back();
      graphs_.back().key = std::move(key);
    }
    return false;
  }
  PS_RETURN_IF_ERROR(kernels_->BeginCapture());
  const absl::Status issued =
      EnqueueSteps(slot, params, {}, pass, gradient_scale, Hooks(), /*outputs=*/nullptr);
  absl::StatusOr<std::unique_ptr<Kernels::Graph>> graph = kernels_->EndCapture();
  PS_RETURN_IF_ERROR(issued);
  if (!graph.ok()) {
    LOG(WARNING) << "model " << config_.name() << ": steps run without graphs from now on ("
                 << graph.status() << ")";
    capture_ = false;
    return false;
  }
  it->graph = *std::move(graph);
  kernels_->Launch(it->graph.get());
  ++graph_launches_;
  return true;
}

void Model::DownloadOutputs(int slot, const Outputs& outputs) {
  const StepOutputs& o = step_outputs_[slot];
  const int64_t bytes = int64_t{inputs_[slot].size} * 4;
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  const auto down = Kernels::Stream::kDownload;
  kernels_->Record(forward_done_.get(), Kernels::Stream::kCompute);
  kernels_->Wait(down, forward_done_.get());
  if (outputs.loss != nullptr) kernels_->CopyToHostAsync(down, o.loss, outputs.loss, bytes);
  if (softmax && outputs.predictions != nullptr) {
    kernels_->CopyToHostAsync(down, o.predictions, outputs.predictions, bytes);
  }
  if (!softmax && outputs.logits != nullptr) {
    kernels_->CopyToHostAsync(down, o.logits, outputs.logits, bytes);
  }
  kernels_->Record(o.downloaded.get(), down);
  if (outputs.ready != nullptr) kernels_->Record(outputs.ready, down);
}

absl::Status Model::EnqueueSteps(int slot, const std::vector<const float*>& params,
                                 const std::vector<const float*>& rows, Pass pass,
                                 float gradient_scale, const Hooks& hooks, const Outputs* outputs) {
  Inputs& in = inputs_[slot];
  const int b = in.size;
  const auto compute = Kernels::Stream::kCompute;
  const int classes = classes_;
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  const bool training = pass != Pass::kInference;
  auto value = [this, &in](int t) { return t == 0 ? in.x0 : tensors_[t].value; };
  if (in.resident) {
    kernels_->GatherRows(resident_dense_, in.positions, b, config_.input_dim(), in.x0);
    kernels_->GatherRows(resident_labels_, in.positions, b, 1,
                         softmax ? static_cast<void*>(in.int_labels) : in.labels);
  }

  // Input: the dense features are in place; each embedding bag into its columns.
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    const Embedding& emb = embeddings_[e];
    if (!emb.wide) {
      kernels_->EmbeddingBagForward(rows[e], in.row_index, in.offsets, b, emb.dim, emb.mean,
                                    input_width_, emb.col, in.x0);
    }
  }
  // The network, in order.
  for (Node& node : nodes_) {
    if (node.group >= 0 && hooks.before_layer) hooks.before_layer(node.group);
    const float* x = value(node.inputs[0]);
    float* y = value(node.output);
    const float* const* w = node.num_variables > 0 ? &params[node.first_variable] : nullptr;
    const int64_t n = b * node.out.size();
    switch (node.op) {
      case Op::kDense: {
        const int units = node.out.channels;
        kernels_->Gemm(false, false, b, units, static_cast<int>(node.in.size()), 1.0f, x, w[0],
                       0.0f, y);
        kernels_->AddBias(w[1], b, units, y);
        break;
      }
      case Op::kConv2D: {
        ConvGeometry g = node.geometry;
        g.batch = b;
        const float* cols = x;
        if (!DirectConv(g)) {
          kernels_->Im2Col(g, x, cols_);
          cols = cols_;
        }
        const int m = static_cast<int>(g.output_positions());
        const int filters = node.out.channels;
        kernels_->Gemm(false, false, m, filters, static_cast<int>(g.patch_size()), 1.0f, cols, w[0],
                       0.0f, y);
        if (node.use_bias) kernels_->AddBias(w[1], m, filters, y);
        break;
      }
      case Op::kBatchNorm: {
        const int64_t positions = int64_t{b} * node.in.height * node.in.width;
        if (training) {
          kernels_->BatchNormForwardTraining(x, positions, node.in.channels, w[0], w[1],
                                             node.epsilon, y, node.mean, node.variance);
        } else {
          kernels_->BatchNormForwardInference(x, positions, node.in.channels, w[0], w[1], w[2],
                                              w[3], node.epsilon, y);
        }
        break;
      }
      case Op::kMaxPool: {
        ConvGeometry g = node.geometry;
        g.batch = b;
        kernels_->MaxPoolForward(g, x, y, node.argmax);
        break;
      }
      case Op::kGlobalAvgPool:
        kernels_->GlobalAvgPoolForward(x, b, node.in.height * node.in.width, node.in.channels, y);
        break;
      case Op::kFlatten:
        break;
      case Op::kActivation:
        kernels_->ActivationForward(node.activation, x, n, y);
        break;
      case Op::kAdd:
        kernels_->Add(n, x, value(node.inputs[1]), y);
        for (size_t i = 2; i < node.inputs.size(); ++i) {
          kernels_->Add(n, y, value(node.inputs[i]), y);
        }
        break;
    }
    if (node.op != Op::kActivation && node.activation != Activation::kLinear) {
      kernels_->ActivationForward(node.activation, y, n, y);
    }
  }
  const int logits_tensor = nodes_.back().output;
  float* logits = value(logits_tensor);
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    if (!embeddings_[e].wide) continue;
    kernels_->EmbeddingBagForward(rows[e], in.row_index, in.offsets, b, classes,
                                  embeddings_[e].mean, classes, 0, wide_out_);
    kernels_->Axpy(int64_t{b} * classes, 1.0f, wide_out_, logits);
  }
  // Loss; its outputs are downloaded while backward runs (a captured step: after it). The
  // downloads of the step that last used this slot's outputs must be over before they are
  // written again.
  StepOutputs& o = step_outputs_[slot];
  if (outputs != nullptr) kernels_->Wait(compute, o.downloaded.get());
  auto grad = [this](int t) { return t == 0 ? dx0_ : tensors_[t].grad; };
  float* dlogits = grad(logits_tensor);
  if (softmax) {
    kernels_->SoftmaxCrossEntropy(logits, in.int_labels, b, classes, o.loss, dlogits);
    kernels_->ArgMax(logits, b, classes, o.predictions);
  } else {
    kernels_->SigmoidCrossEntropy(logits, in.labels, b, o.loss, dlogits);
    // The next step's forward writes the logits while these go to the host.
    kernels_->ScaleCopy(b, 1.0f, logits, o.logits);
  }
  if (outputs != nullptr) DownloadOutputs(slot, *outputs);
  if (pass != Pass::kTraining) {
    if (outputs != nullptr) kernels_->Record(in.consumed.get(), compute);
    return absl::OkStatus();
  }

  // Backward: dlogits is the gradient of the mean loss (of this tower's examples, scaled to
  // its share). A layer writes the gradient of each tensor it reads; the first writer of a
  // tensor writes it in place, later ones (a tensor read twice, as a residual block's input)
  // write accum_ and add it.
  if (hooks.before_backward) hooks.before_backward();
  if (gradient_scale != 1.0f) kernels_->Scale(int64_t{b} * classes, gradient_scale, dlogits);
  const bool towers = static_cast<bool>(hooks.reduce_gradients);
  std::vector<bool> written(tensors_.size(), false);
  written[logits_tensor] = true;
  // Where the gradient of tensor t goes; null when nobody needs it (the model's input without
  // tables feeding it).
  auto target = [&](int t) -> float* {
    if (t == 0 && !need_input_grad_) return nullptr;
    if (!written[t]) {
      written[t] = true;
      return grad(t);
    }
    return accum_;
  };
  auto finish = [&](int t, float* p, int64_t n) {
    if (p == accum_) kernels_->Axpy(n, 1.0f, accum_, grad(t));
  };
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    Node& node = *it;
    if (node.op == Op::kFlatten) continue;
    float* dy = grad(node.output);
    const float* x = value(node.inputs[0]);
    const float* const* w = node.num_variables > 0 ? &params[node.first_variable] : nullptr;
    float* dw = node.num_variables > 0 ? grads_ + dense_offsets_[node.first_variable] : nullptr;
    const int64_t n = b * node.out.size();
    const int64_t n_in = b * node.in.size();
    if (node.op != Op::kActivation && node.activation != Activation::kLinear) {
      kernels_->ActivationBackward(node.activation, value(node.output), dy, n, dy);
    }
    switch (node.op) {
      case Op::kDense: {
        const int units = node.out.channels;
        const int in_size = static_cast<int>(node.in.size());
        kernels_->Gemm(true, false, in_size, units, b, 1.0f, x, dy, 0.0f, dw);
        kernels_->BiasGrad(dy, b, units, grads_ + dense_offsets_[node.first_variable + 1]);
        if (float* dx = target(node.inputs[0])) {
          kernels_->Gemm(false, true, b, in_size, units, 1.0f, dy, w[0], 0.0f, dx);
          finish(node.inputs[0], dx, n_in);
        }
        break;
      }
      case Op::kConv2D: {
        ConvGeometry g = node.geometry;
        g.batch = b;
        const bool direct = DirectConv(g);
        const float* cols = x;
        if (!direct) {
          kernels_->Im2Col(g, x, cols_);
          cols = cols_;
        }
        const int m = static_cast<int>(g.output_positions());
        const int k = static_cast<int>(g.patch_size());
        const int filters = node.out.channels;
        kernels_->Gemm(true, false, k, filters, m, 1.0f, cols, dy, 0.0f, dw);
        if (node.use_bias) {
          kernels_->BiasGrad(dy, m, filters, grads_ + dense_offsets_[node.first_variable + 1]);
        }
        if (float* dx = target(node.inputs[0])) {
          if (direct) {
            kernels_->Gemm(false, true, m, k, filters, 1.0f, dy, w[0], 0.0f, dx);
          } else {
            kernels_->Gemm(false, true, m, k, filters, 1.0f, dy, w[0], 0.0f, cols_);
            kernels_->Col2Im(g, cols_, dx);
          }
          finish(node.inputs[0], dx, n_in);
        }
        break;
      }
      case Op::kBatchNorm: {
        const int c = node.in.channels;
        const int64_t positions = int64_t{b} * node.in.height * node.in.width;
        float* dx = target(node.inputs[0]);
        // Without an input gradient to write, accum_ takes the (unused) dx.
        kernels_->BatchNormBackward(x, dy, positions, c, w[0], node.mean, node.variance,
                                    node.epsilon, dw, dw + c, dx != nullptr ? dx : accum_);
        if (dx != nullptr) finish(node.inputs[0], dx, n_in);
        // The moving statistics' pushes are the batch's statistics (the ps keeps their moving
        // average: BatchNormLayer), the variance with Bessel's correction; scaled by a tower's
        // share, so that the towers' sum is their mean.
        const float bessel = positions > 1
                                 ? static_cast<float>(positions) / static_cast<float>(positions - 1)
                                 : 1.0f;
        kernels_->ScaleCopy(c, gradient_scale, node.mean, dw + 2 * c);
        kernels_->ScaleCopy(c, gradient_scale * bessel, node.variance, dw + 3 * c);
        break;
      }
      case Op::kMaxPool: {
        ConvGeometry g = node.geometry;
        g.batch = b;
        if (float* dx = target(node.inputs[0])) {
          kernels_->MaxPoolBackward(g, dy, node.argmax, dx);
          finish(node.inputs[0], dx, n_in);
        }
        break;
      }
      case Op::kGlobalAvgPool:
        if (float* dx = target(node.inputs[0])) {
          kernels_->GlobalAvgPoolBackward(dy, b, node.in.height * node.in.width, node.in.channels,
                                          dx);
          finish(node.inputs[0], dx, n_in);
        }
        break;
      case Op::kFlatten:
        break;
      case Op::kActivation:
        if (float* dx = target(node.inputs[0])) {
          kernels_->ActivationBackward(node.activation, value(node.output), dy, n, dx);
          finish(node.inputs[0], dx, n_in);
        }
        break;
      case Op::kAdd:
        for (int t : node.inputs) {
          if (float* dx = target(t)) {
            kernels_->ScaleCopy(n, 1.0f, dy, dx);
            finish(t, dx, n);
          }
        }
        break;
    }
    if (!towers && hooks.gradient_ready) {
      for (int v = node.first_variable + node.num_variables - 1; v >= node.first_variable; --v) {
        hooks.gradient_ready(v);
      }
    }
  }
  const int num_dense = static_cast<int>(dense_names_.size());
  const int64_t num_rows = in.num_rows;
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    const Embedding& emb = embeddings_[e];
    PS_RETURN_IF_ERROR(Reserve(&drows_[e], &drows_capacity_[e], num_rows * emb.dim));
    kernels_->Fill(drows_[e], num_rows * emb.dim, 0.0f);
    if (emb.wide) {
      kernels_->EmbeddingBagBackward(dlogits, in.row_index, in.offsets, b, emb.dim, emb.mean,
                                     classes, 0, drows_[e]);
    } else {
      kernels_->EmbeddingBagBackward(dx0_, in.row_index, in.offsets, b, emb.dim, emb.mean,
                                     input_width_, emb.col, drows_[e]);
    }
    if (!towers && hooks.gradient_ready) hooks.gradient_ready(num_dense + static_cast<int>(e));
  }
  if (outputs == nullptr) return absl::OkStatus();  // captured: the caller records
  kernels_->Record(in.consumed.get(), compute);
  if (towers) {
    PS_RETURN_IF_ERROR(hooks.reduce_gradients());
    if (hooks.gradient_ready) {
      for (int v = num_dense - 1; v >= 0; --v) hooks.gradient_ready(v);
      for (size_t e = 0; e < embeddings_.size(); ++e) {
        hooks.gradient_ready(num_dense + static_cast<int>(e));
      }
    }
  }
  kernels_->Record(gradient_done_.get(), compute);
  return absl::OkStatus();
}

absl::Status Model::Compute(const Batch& batch, const SparseInput& sparse,
                            const std::vector<const float*>& params,
                            const std::vector<const float*>& rows, Pass pass, StepResult* result) {
  const bool backward = pass == Pass::kTraining;
  if (params.size() != dense_names_.size() || rows.size() != embeddings_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", params.size(), " dense variables and ", rows.size(),
                     " tables; the model has ", dense_names_.size(), " and ", embeddings_.size()));
  }
  constexpr int kSlot = 0;
  PS_RETURN_IF_ERROR(StageInputs(kSlot, batch, sparse));
  const int b = batch.size;
  // Parameters and rows to the device (a no-op copy for the CPU, whose memory is the host's).
  std::vector<const float*> device_params(params.size()), device_rows(rows.size());
  if (kernels_->device_is_host()) {
    device_params = params;
  } else {
    if (compute_params_ == nullptr) {
      PS_ASSIGN_OR_RETURN(compute_params_, Floats(dense_total_));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      kernels_->CopyToDevice(params[i], compute_params_ + dense_offsets_[i], dense_sizes_[i]);
      device_params[i] = compute_params_ + dense_offsets_[i];
    }
  }
  const int64_t num_rows = static_cast<int64_t>(sparse.unique_ids.size());
  for (size_t t = 0; t < rows.size(); ++t) {
    if (kernels_->device_is_host()) {
      device_rows[t] = rows[t];
      continue;
    }
    PS_RETURN_IF_ERROR(
        Reserve(&compute_rows_[t], &compute_rows_capacity_[t], num_rows * table_dims_[t]));
    kernels_->CopyToDevice(rows[t], compute_rows_[t], num_rows * table_dims_[t]);
    device_rows[t] = compute_rows_[t];
  }
  if (compute_outputs_.loss == nullptr) {
    PS_ASSIGN_OR_RETURN(void* loss, kernels_->AllocateHost(int64_t{max_batch_} * 4));
    owned_host_.push_back(loss);
    PS_ASSIGN_OR_RETURN(void* pred, kernels_->AllocateHost(int64_t{max_batch_} * 4));
    owned_host_.push_back(pred);
    PS_ASSIGN_OR_RETURN(void* logits, kernels_->AllocateHost(int64_t{max_batch_} * 4));
    owned_host_.push_back(logits);
    compute_ready_ = kernels_->NewEvent();
    compute_outputs_.loss = static_cast<float*>(loss);
    compute_outputs_.predictions = static_cast<int32_t*>(pred);
    compute_outputs_.logits = static_cast<float*>(logits);
    compute_outputs_.ready = compute_ready_.get();
  }
  PS_RETURN_IF_ERROR(
      Enqueue(kSlot, device_params, device_rows, pass, 1.0f, Hooks(), compute_outputs_));
  kernels_->Synchronize(compute_ready_.get());
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  double sum = 0;
  result->correct = 0;
  result->scores.clear();
  for (int i = 0; i < b; ++i) {
    sum += compute_outputs_.loss[i];
    if (softmax) {
      result->correct += compute_outputs_.predictions[i] == static_cast<int32_t>(batch.labels[i]);
    } else {
      const float p = 1.0f / (1.0f + std::exp(-compute_outputs_.logits[i]));
      result->scores.push_back(p);
      result->correct += (p > 0.5f) == (batch.labels[i] > 0.5f);
    }
  }
  result->loss = sum / b;
  if (!backward) return absl::OkStatus();
  result->dense_grads.resize(dense_names_.size());
  for (size_t i = 0; i < dense_names_.size(); ++i) {
    result->dense_grads[i].resize(dense_sizes_[i]);
    kernels_->CopyToHost(grads_ + dense_offsets_[i], result->dense_grads[i].data(),
                         dense_sizes_[i]);
  }
  result->row_grads.resize(embeddings_.size());
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    result->row_grads[e].resize(num_rows * embeddings_[e].dim);
    kernels_->CopyToHost(drows_[e], result->row_grads[e].data(), num_rows * embeddings_[e].dim);
  }
  return absl::OkStatus();
}

}  // namespace pscluster
