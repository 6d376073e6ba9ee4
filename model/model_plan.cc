// Model's plan: a config checked and turned into the variables, the layers (model/layer.h)
// and the tensors between them, before anything is allocated.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/layer.h"
#include "model/model.h"

namespace pscluster {

namespace {

// The config's name of a layer's kind ("layer" when it has none).
const char* KindName(const v1::Layer& l) {
  const Layer* layer = FindLayer(l.kind_case());
  return layer != nullptr ? layer->kind() : "layer";
}

}  // namespace

absl::Status Model::CheckInput(const v1::ModelConfig& config) {
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
          absl::StrCat("input_shape ", DimsString(Dims{s.height(), s.width(), s.channels()}),
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
  return absl::OkStatus();
}

absl::StatusOr<int> Model::PlanTables(const v1::ModelConfig& config, Plan* plan,
                                      std::set<std::string>* names) {
  int width = config.input_dim();
  for (const v1::EmbeddingBagLayer& e : config.embeddings()) {
    if (e.dim() < 1 || e.table().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("embedding layer ", e.name(),
                                                     " needs a table and dim >= 1, got table \"",
                                                     e.table(), "\" and dim ", e.dim()));
    }
    if (!names->insert(e.table()).second) {
      return absl::InvalidArgumentError(absl::StrCat("name ", e.table(), " is used twice"));
    }
    if (!e.wide()) {
      if (config.has_input_shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "embedding layer ", e.name(),
            " would be concatenated to an image input (input_shape); only wide embedding "
            "layers go with input_shape"));
      }
      width += e.dim();
    }
    v1::TableSpec* t = plan->spec.add_tables();
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
  return width;
}

absl::Status Model::PlanChain(const v1::ModelConfig& config, const Dims& input, Plan* plan,
                              std::set<std::string>* names) {
  PlanContext ctx(config, &plan->spec);
  Dims in = input;
  int source = 0;
  for (int i = 0; i < config.layers_size(); ++i) {
    const v1::DenseLayer& l = config.layers(i);
    const std::string name = l.name().empty() ? absl::StrCat("dense_", i) : l.name();
    if (i == config.layers_size() - 1 && l.activation() != v1::LINEAR) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the last layer, ", name, ", must be linear: the loss applies softmax or sigmoid"));
    }
    if (!names->insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("name ", name, " is used twice"));
    }
    Node node;
    node.layer = FindLayer(v1::Layer::kDense);
    node.name = name;
    node.inputs = {source};
    node.in = Dims{1, 1, static_cast<int>(in.size())};
    PS_RETURN_IF_ERROR(PlanDense(l, node.in, &ctx, &node));
    node.output = static_cast<int>(plan->tensor_sizes.size());
    plan->tensor_sizes.push_back(node.out.size());
    node.group = i;
    plan->group_first.push_back(node.first_variable);
    in = node.out;
    source = node.output;
    plan->nodes.push_back(std::move(node));
  }
  return absl::OkStatus();
}

absl::Status Model::NetworkInputs(const v1::Layer& l, int index, const std::string& name,
                                  const Dims& input, const Plan& plan,
                                  const std::map<std::string, int>& node_of,
                                  std::vector<bool>* read, std::vector<int>* sources,
                                  std::vector<Dims>* shapes) {
  auto read_node = [&](int n) {
    sources->push_back(plan.nodes[n].output);
    shapes->push_back(plan.nodes[n].out);
    (*read)[n] = true;
  };
  if (l.inputs().empty()) {
    if (index == 0) {
      sources->push_back(0);
      shapes->push_back(input);
    } else {
      read_node(index - 1);
    }
  }
  for (const std::string& from : l.inputs()) {
    if (from == "input") {
      sources->push_back(0);
      shapes->push_back(input);
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
  if (l.kind_case() != v1::Layer::kAdd && sources->size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", name, " (", KindName(l), ") reads ",
                                                   sources->size(),
                                                   " inputs; only add reads more than one"));
  }
  return absl::OkStatus();
}

absl::Status Model::PlanNetwork(const v1::ModelConfig& config, const Dims& input, Plan* plan,
                                std::set<std::string>* names) {
  PlanContext ctx(config, &plan->spec);
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
                       "average_pool, global_average_pool, flatten, activation, add"));
    }
    if (name == "input" || !names->insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("name ", name,
                       name == "input" ? " is reserved for the model's input" : " is used twice"));
    }
    Node node;
    std::vector<Dims> shapes;
    PS_RETURN_IF_ERROR(
        NetworkInputs(l, i, name, input, *plan, node_of, &read, &node.inputs, &shapes));
    node.layer = FindLayer(l.kind_case());
    node.name = name;
    node.in = shapes[0];
    node.out = shapes[0];
    PS_RETURN_IF_ERROR(node.layer->Plan(l, shapes, &ctx, &node));
    if (node.in.size() >= std::numeric_limits<int32_t>::max() ||
        node.out.size() >= std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", name, " has more than 2^31 - 1 floats per example in its input or output"));
    }
    if (node.layer->aliases_input()) {
      node.output = node.inputs[0];
    } else {
      node.output = static_cast<int>(plan->tensor_sizes.size());
      plan->tensor_sizes.push_back(node.out.size());
    }
    node_of[name] = i;
    plan->nodes.push_back(std::move(node));
  }
  for (int i = 0; i + 1 < config.network_size(); ++i) {
    if (!read[i]) {
      return absl::InvalidArgumentError(absl::StrCat("the output of layer ", plan->nodes[i].name,
                                                     " is not read by any later layer"));
    }
  }
  const Node& last = plan->nodes.back();
  if (last.layer->aliases_input()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the last layer, ", last.name,
        ", is a flatten; the logits must come from a layer that computes them (dense)"));
  }
  if (!last.out.flat()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the last layer, ", last.name, ", outputs ", DimsString(last.out),
        "; the logits must be flat (end with flatten or global_average_pool and dense)"));
  }
  if (last.activation != Activation::kLinear) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the last layer, ", last.name, ", must be linear: the loss applies softmax or sigmoid"));
  }
  GroupVariables(plan);
  return absl::OkStatus();
}

void Model::GroupVariables(Plan* plan) {
  // Groups of about an eighth of the parameters each, in forward order.
  auto size = [plan](int v) {
    int64_t n = 1;
    for (int64_t d : plan->spec.variables(v).shape().dims()) n *= d;
    return n;
  };
  int64_t total = 0;
  for (int v = 0; v < plan->spec.variables_size(); ++v) total += size(v);
  const int64_t target = std::max<int64_t>(total / 8, 1);
  int64_t in_group = target;  // the first node with variables opens a group
  for (Node& node : plan->nodes) {
    if (node.num_variables == 0) continue;
    if (in_group >= target) {
      node.group = static_cast<int>(plan->group_first.size());
      plan->group_first.push_back(node.first_variable);
      in_group = 0;
    }
    for (int v = node.first_variable; v < node.first_variable + node.num_variables; ++v) {
      in_group += size(v);
    }
  }
}

absl::StatusOr<Model::Plan> Model::MakePlan(const v1::ModelConfig& config) {
  PS_RETURN_IF_ERROR(CheckInput(config));
  Plan plan;
  std::set<std::string> names;
  PS_ASSIGN_OR_RETURN(const int width, PlanTables(config, &plan, &names));
  Dims input;
  if (config.has_input_shape() && config.network_size() > 0) {
    input = {config.input_shape().height(), config.input_shape().width(),
             config.input_shape().channels()};
  } else {
    input.channels = width;
  }
  plan.tensor_sizes.push_back(input.size());
  if (config.layers_size() > 0) {
    PS_RETURN_IF_ERROR(PlanChain(config, input, &plan, &names));
  } else {
    PS_RETURN_IF_ERROR(PlanNetwork(config, input, &plan, &names));
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
    words += node.layer->IndexInts(node);
    cols = std::max(cols, node.layer->PatchFloats(node));
  }
  const int64_t classes = plan.nodes.back().out.size();
  // accum_, the patches, and per slot the loss, predictions and logits.
  words += largest + cols + kInputSlots * 3 + classes;
  return words * 4;
}

}  // namespace pscluster
