#include "worker/model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

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

absl::StatusOr<v1::ModelSpec> ModelSpecFromConfig(const v1::ModelConfig& config) {
  if (config.layers_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", config.name(), " has no dense layers; at least one is needed"));
  }
  if (config.input_dim() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("input_dim must be >= 0, got ",
                                                   config.input_dim()));
  }
  std::set<std::string> names;
  v1::ModelSpec spec;
  const int out_units = config.layers(config.layers_size() - 1).units();
  int width = config.input_dim();
  for (const v1::EmbeddingBagLayer& e : config.embeddings()) {
    if (e.dim() < 1 || e.table().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("embedding layer ", e.name(),
                                                     " needs a table and dim >= 1, got table \"",
                                                     e.table(), "\" and dim ", e.dim()));
    }
    if (e.wide() && e.dim() != out_units) {
      return absl::InvalidArgumentError(absl::StrCat("wide embedding layer ", e.name(), " has dim ",
                                                     e.dim(), "; it must equal the output size ",
                                                     out_units));
    }
    if (!names.insert(e.table()).second) {
      return absl::InvalidArgumentError(absl::StrCat("name ", e.table(), " is used twice"));
    }
    if (!e.wide()) width += e.dim();
    v1::TableSpec* t = spec.add_tables();
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
  }
  if (width < 1) {
    return absl::InvalidArgumentError("the first dense layer has no inputs: input_dim is 0 and "
                                      "no embedding is concatenated");
  }
  for (int i = 0; i < config.layers_size(); ++i) {
    const v1::DenseLayer& l = config.layers(i);
    const std::string name = l.name().empty() ? absl::StrCat("dense_", i) : l.name();
    if (l.units() < 1) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", name, " has ", l.units(),
                                                     " units; it needs at least 1"));
    }
    if (i == config.layers_size() - 1 && l.activation() != v1::LINEAR) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the last layer, ", name, ", must be linear: the loss applies softmax or sigmoid"));
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("name ", name, " is used twice"));
    }
    v1::VariableSpec* kernel = spec.add_variables();
    kernel->set_name(name + "/kernel");
    kernel->mutable_shape()->add_dims(width);
    kernel->mutable_shape()->add_dims(l.units());
    kernel->set_dtype(v1::DT_FLOAT32);
    if (l.has_kernel_initializer()) {
      *kernel->mutable_initializer() = l.kernel_initializer();
    } else {
      kernel->mutable_initializer()->set_kind(v1::InitializerSpec::GLOROT_UNIFORM);
      kernel->mutable_initializer()->set_seed(config.seed());
    }
    *kernel->mutable_optimizer() = l.has_optimizer() ? l.optimizer() : config.optimizer();
    v1::VariableSpec* bias = spec.add_variables();
    bias->set_name(name + "/bias");
    bias->mutable_shape()->add_dims(l.units());
    bias->set_dtype(v1::DT_FLOAT32);
    *bias->mutable_initializer() = l.bias_initializer();
    *bias->mutable_optimizer() = kernel->optimizer();
    width = l.units();
  }
  if (config.loss() == v1::ModelConfig::SIGMOID_CROSS_ENTROPY && out_units != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a sigmoid cross-entropy loss needs 1 output unit, the last layer has ", out_units));
  }
  if (config.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY && out_units < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a softmax cross-entropy loss needs at least 2 classes, the last layer has ", out_units));
  }
  return spec;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const v1::ModelConfig& config,
                                                     Kernels* kernels, int max_batch) {
  PS_ASSIGN_OR_RETURN(v1::ModelSpec spec, ModelSpecFromConfig(config));
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch must be >= 1, got ", max_batch));
  }
  auto model = std::unique_ptr<Model>(new Model(config, kernels, max_batch));
  for (const v1::VariableSpec& v : spec.variables()) {
    model->dense_names_.push_back(v.name());
    int64_t n = 1;
    for (int64_t d : v.shape().dims()) n *= d;
    model->dense_sizes_.push_back(n);
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
    }
    model->embeddings_.push_back(emb);
    model->table_names_.push_back(e.table());
    model->table_dims_.push_back(e.dim());
  }
  int in = model->input_width_;
  for (const v1::DenseLayer& l : config.layers()) {
    Layer layer;
    layer.in = in;
    layer.units = l.units();
    layer.activation = ToActivation(l.activation());
    model->layers_.push_back(layer);
    in = l.units();
  }
  PS_RETURN_IF_ERROR(model->Allocate());
  return model;
}

Model::Model(v1::ModelConfig config, Kernels* kernels, int max_batch)
    : config_(std::move(config)), kernels_(kernels), max_batch_(max_batch) {}

Model::~Model() {
  for (void* p : owned_) kernels_->Free(p);
}

absl::StatusOr<float*> Model::Floats(int64_t n) {
  PS_ASSIGN_OR_RETURN(float* p, kernels_->AllocateFloats(std::max<int64_t>(n, 1)));
  owned_.push_back(p);
  return p;
}

absl::Status Model::Allocate() {
  const int64_t b = max_batch_;
  PS_ASSIGN_OR_RETURN(x0_, Floats(b * input_width_));
  PS_ASSIGN_OR_RETURN(dx0_, Floats(b * input_width_));
  for (Layer& l : layers_) {
    PS_ASSIGN_OR_RETURN(l.kernel, Floats(int64_t{l.in} * l.units));
    PS_ASSIGN_OR_RETURN(l.dkernel, Floats(int64_t{l.in} * l.units));
    PS_ASSIGN_OR_RETURN(l.bias, Floats(l.units));
    PS_ASSIGN_OR_RETURN(l.dbias, Floats(l.units));
    PS_ASSIGN_OR_RETURN(l.out, Floats(b * l.units));
    PS_ASSIGN_OR_RETURN(l.dout, Floats(b * l.units));
  }
  PS_ASSIGN_OR_RETURN(labels_, Floats(b));
  PS_ASSIGN_OR_RETURN(loss_, Floats(b));
  PS_ASSIGN_OR_RETURN(wide_out_, Floats(b * layers_.back().units));
  PS_ASSIGN_OR_RETURN(int_labels_, kernels_->AllocateInts(b));
  owned_.push_back(int_labels_);
  PS_ASSIGN_OR_RETURN(predictions_, kernels_->AllocateInts(b));
  owned_.push_back(predictions_);
  PS_ASSIGN_OR_RETURN(offsets_, kernels_->AllocateInts(b + 1));
  owned_.push_back(offsets_);
  rows_.assign(embeddings_.size(), nullptr);
  drows_.assign(embeddings_.size(), nullptr);
  rows_capacity_.assign(embeddings_.size(), 0);
  drows_capacity_.assign(embeddings_.size(), 0);
  return absl::OkStatus();
}

absl::Status Model::Reserve(std::vector<float*>* buffers, std::vector<int64_t>* capacity,
                            size_t i, int64_t n) {
  if ((*capacity)[i] >= n) return absl::OkStatus();
  const int64_t grown = std::max(n, 2 * (*capacity)[i]);
  PS_ASSIGN_OR_RETURN(float* p, kernels_->AllocateFloats(grown));
  if ((*buffers)[i] != nullptr) {
    kernels_->Free((*buffers)[i]);
    owned_.erase(std::find(owned_.begin(), owned_.end(), (*buffers)[i]));
  }
  owned_.push_back(p);
  (*buffers)[i] = p;
  (*capacity)[i] = grown;
  return absl::OkStatus();
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

absl::Status Model::Compute(const Batch& batch, const SparseInput& sparse,
                            const std::vector<const float*>& params,
                            const std::vector<const float*>& rows, bool backward,
                            StepResult* result) {
  const int b = batch.size;
  if (b < 1 || b > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", b, " examples; this model takes 1 to ", max_batch_));
  }
  if (params.size() != dense_names_.size() || rows.size() != embeddings_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "got ", params.size(), " dense variables and ", rows.size(), " tables; the model has ",
        dense_names_.size(), " and ", embeddings_.size()));
  }
  const int classes = layers_.back().units;
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  std::vector<int32_t> int_labels(b);
  for (int i = 0; i < b; ++i) {
    const float y = batch.labels[i];
    const bool ok = softmax ? (y >= 0 && y < classes && y == std::floor(y)) : (y == 0 || y == 1);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", y, " of example ", i, " is out of range: expected ",
          softmax ? absl::StrCat("a class in 0..", classes - 1) : std::string("0 or 1")));
    }
    int_labels[i] = static_cast<int32_t>(y);
  }

  // Parameters in.
  for (size_t l = 0; l < layers_.size(); ++l) {
    kernels_->CopyToDevice(params[2 * l], layers_[l].kernel,
                           int64_t{layers_[l].in} * layers_[l].units);
    kernels_->CopyToDevice(params[2 * l + 1], layers_[l].bias, layers_[l].units);
  }
  // Input: dense features, then each embedding bag into its columns.
  std::vector<float> x0(static_cast<size_t>(b) * input_width_, 0.0f);
  for (int i = 0; i < b; ++i) {
    std::copy_n(batch.dense + int64_t{i} * config_.input_dim(), config_.input_dim(),
                x0.data() + int64_t{i} * input_width_);
  }
  kernels_->CopyToDevice(x0.data(), x0_, x0.size());
  const int64_t num_rows = static_cast<int64_t>(sparse.unique_ids.size());
  if (!embeddings_.empty()) {
    if (row_index_capacity_ < static_cast<int64_t>(sparse.row_index.size())) {
      if (row_index_ != nullptr) {
        kernels_->Free(row_index_);
        owned_.erase(std::find(owned_.begin(), owned_.end(), row_index_));
      }
      row_index_capacity_ = std::max<int64_t>(sparse.row_index.size(), 2 * row_index_capacity_);
      PS_ASSIGN_OR_RETURN(row_index_, kernels_->AllocateInts(row_index_capacity_));
      owned_.push_back(row_index_);
    }
    kernels_->CopyToDevice(sparse.row_index.data(), row_index_, sparse.row_index.size());
    kernels_->CopyToDevice(sparse.offsets.data(), offsets_, sparse.offsets.size());
  }
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    const Embedding& emb = embeddings_[e];
    PS_RETURN_IF_ERROR(Reserve(&rows_, &rows_capacity_, e, num_rows * emb.dim));
    kernels_->CopyToDevice(rows[e], rows_[e], num_rows * emb.dim);
    if (!emb.wide) {
      kernels_->EmbeddingBagForward(rows_[e], row_index_, offsets_, b, emb.dim, emb.mean,
                                    input_width_, emb.col, x0_);
    }
  }
  // Dense layers.
  const float* x = x0_;
  for (Layer& l : layers_) {
    kernels_->Gemm(false, false, b, l.units, l.in, 1.0f, x, l.kernel, 0.0f, l.out);
    kernels_->AddBias(l.bias, b, l.units, l.out);
    kernels_->ActivationForward(l.activation, l.out, int64_t{b} * l.units, l.out);
    x = l.out;
  }
  float* logits = layers_.back().out;
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    if (!embeddings_[e].wide) continue;
    kernels_->EmbeddingBagForward(rows_[e], row_index_, offsets_, b, classes,
                                  embeddings_[e].mean, classes, 0, wide_out_);
    kernels_->Axpy(int64_t{b} * classes, 1.0f, wide_out_, logits);
  }
  // Loss.
  float* dlogits = layers_.back().dout;
  std::vector<float> loss(b);
  if (softmax) {
    kernels_->CopyToDevice(int_labels.data(), int_labels_, b);
    kernels_->SoftmaxCrossEntropy(logits, int_labels_, b, classes, loss_, dlogits);
    kernels_->ArgMax(logits, b, classes, predictions_);
    std::vector<float> pred(b);
    std::vector<int32_t> pred_i(b);
    kernels_->CopyToHost(loss_, loss.data(), b);
    // ArgMax results travel as floats through a float copy of the int buffer.
    kernels_->CopyToHostInts(predictions_, pred_i.data(), b);
    result->correct = 0;
    for (int i = 0; i < b; ++i) result->correct += pred_i[i] == int_labels[i];
    result->scores.clear();
  } else {
    kernels_->CopyToDevice(batch.labels, labels_, b);
    kernels_->SigmoidCrossEntropy(logits, labels_, b, loss_, dlogits);
    kernels_->CopyToHost(loss_, loss.data(), b);
    result->scores.resize(b);
    kernels_->CopyToHost(logits, result->scores.data(), b);
    result->correct = 0;
    for (int i = 0; i < b; ++i) {
      result->scores[i] = 1.0f / (1.0f + std::exp(-result->scores[i]));
      result->correct += (result->scores[i] > 0.5f) == (batch.labels[i] > 0.5f);
    }
  }
  double sum = 0;
  for (float v : loss) sum += v;
  result->loss = sum / b;
  if (!backward) return absl::OkStatus();

  // Backward: dlogits is already the gradient of the mean loss.
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    Layer& layer = layers_[l];
    const float* input = l == 0 ? x0_ : layers_[l - 1].out;
    kernels_->ActivationBackward(layer.activation, layer.out, layer.dout,
                                 int64_t{b} * layer.units, layer.dout);
    kernels_->Gemm(true, false, layer.in, layer.units, b, 1.0f, input, layer.dout, 0.0f,
                   layer.dkernel);
    kernels_->BiasGrad(layer.dout, b, layer.units, layer.dbias);
    float* dinput = l == 0 ? dx0_ : layers_[l - 1].dout;
    if (l > 0 || !embeddings_.empty()) {
      kernels_->Gemm(false, true, b, layer.in, layer.units, 1.0f, layer.dout, layer.kernel, 0.0f,
                     dinput);
    }
  }
  result->dense_grads.resize(dense_names_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    result->dense_grads[2 * l].resize(int64_t{layers_[l].in} * layers_[l].units);
    kernels_->CopyToHost(layers_[l].dkernel, result->dense_grads[2 * l].data(),
                         result->dense_grads[2 * l].size());
    result->dense_grads[2 * l + 1].resize(layers_[l].units);
    kernels_->CopyToHost(layers_[l].dbias, result->dense_grads[2 * l + 1].data(),
                         layers_[l].units);
  }
  result->row_grads.resize(embeddings_.size());
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    const Embedding& emb = embeddings_[e];
    PS_RETURN_IF_ERROR(Reserve(&drows_, &drows_capacity_, e, num_rows * emb.dim));
    kernels_->Fill(drows_[e], num_rows * emb.dim, 0.0f);
    if (emb.wide) {
      kernels_->EmbeddingBagBackward(dlogits, row_index_, offsets_, b, emb.dim, emb.mean,
                                     classes, 0, drows_[e]);
    } else {
      kernels_->EmbeddingBagBackward(dx0_, row_index_, offsets_, b, emb.dim, emb.mean,
                                     input_width_, emb.col, drows_[e]);
    }
    result->row_grads[e].resize(num_rows * emb.dim);
    kernels_->CopyToHost(drows_[e], result->row_grads[e].data(), result->row_grads[e].size());
  }
  return absl::OkStatus();
}

}  // namespace pscluster
