#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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
    return absl::InvalidArgumentError(
        absl::StrCat("input_dim must be >= 0, got ", config.input_dim()));
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
    if (e.has_admission()) *t->mutable_admission() = e.admission();
    if (e.has_eviction()) *t->mutable_eviction() = e.eviction();
  }
  if (width < 1) {
    return absl::InvalidArgumentError(
        "the first dense layer has no inputs: input_dim is 0 and "
        "no embedding is concatenated");
  }
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
  // Copies in flight may still read or write these buffers.
  for (Inputs& in : inputs_) {
    if (in.uploaded) kernels_->Synchronize(in.uploaded.get());
    if (in.consumed) kernels_->Synchronize(in.consumed.get());
  }
  if (outputs_downloaded_) kernels_->Synchronize(outputs_downloaded_.get());
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
    in.rows.assign(embeddings_.size(), nullptr);
    in.rows_capacity.assign(embeddings_.size(), 0);
    in.uploaded = kernels_->NewEvent();
    in.consumed = kernels_->NewEvent();
  }
  PS_ASSIGN_OR_RETURN(grads_, Floats(dense_total_));
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    layer.dkernel = grads_ + dense_offsets_[2 * l];
    layer.dbias = grads_ + dense_offsets_[2 * l + 1];
    PS_ASSIGN_OR_RETURN(layer.out, Floats(b * layer.units));
    PS_ASSIGN_OR_RETURN(layer.dout, Floats(b * layer.units));
  }
  PS_ASSIGN_OR_RETURN(dx0_, Floats(b * input_width_));
  PS_ASSIGN_OR_RETURN(loss_, Floats(b));
  PS_ASSIGN_OR_RETURN(predictions_, Ints(b));
  PS_ASSIGN_OR_RETURN(wide_out_, Floats(b * layers_.back().units));
  drows_.assign(embeddings_.size(), nullptr);
  drows_capacity_.assign(embeddings_.size(), 0);
  compute_rows_.assign(embeddings_.size(), nullptr);
  compute_rows_capacity_.assign(embeddings_.size(), 0);
  outputs_downloaded_ = kernels_->NewEvent();
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

absl::Status Model::CheckLabels(const Batch& batch) const {
  const int b = batch.size;
  if (b < 1 || b > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", b, " examples; this model takes 1 to ", max_batch_));
  }
  const int classes = layers_.back().units;
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  for (int i = 0; i < b; ++i) {
    const float y = batch.labels[i];
    const bool ok = softmax ? (y >= 0 && y < classes && y == std::floor(y)) : (y == 0 || y == 1);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", y, " of example ", i, " is out of range: expected ",
          softmax ? absl::StrCat("a class in 0..", classes - 1) : std::string("0 or 1")));
    }
  }
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

absl::Status Model::StageGathered(int slot, const float* dense, const float* labels,
                                  const int64_t* positions, int n) {
  if (!embeddings_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", config_.name(), " has embedding tables: stage its batches with StageInputs"));
  }
  if (n < 1 || n > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", n, " examples; this model takes 1 to ", max_batch_));
  }
  const int classes = layers_.back().units;
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  for (int i = 0; i < n; ++i) {
    const float y = labels[positions[i]];
    const bool ok = softmax ? (y >= 0 && y < classes && y == std::floor(y)) : (y == 0 || y == 1);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", y, " of example ", positions[i], " is out of range: expected ",
          softmax ? absl::StrCat("a class in 0..", classes - 1) : std::string("0 or 1")));
    }
  }
  Inputs& in = inputs_[slot];
  kernels_->Synchronize(in.uploaded.get());
  const int64_t input_dim = config_.input_dim();
  for (int i = 0; i < n; ++i) {
    std::memcpy(in.host_dense + i * input_dim, dense + positions[i] * input_dim,
                input_dim * sizeof(float));
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

absl::Status Model::Enqueue(int slot, const std::vector<const float*>& params,
                            const std::vector<const float*>& rows, bool backward,
                            float gradient_scale, const Hooks& hooks, const Outputs& outputs) {
  if (params.size() != dense_names_.size() || rows.size() != embeddings_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", params.size(), " dense variables and ", rows.size(),
                     " tables; the model has ", dense_names_.size(), " and ", embeddings_.size()));
  }
  Inputs& in = inputs_[slot];
  const int b = in.size;
  if (b < 1) return absl::FailedPreconditionError(absl::StrCat("input slot ", slot, " is empty"));
  const auto compute = Kernels::Stream::kCompute;
  kernels_->Wait(compute, in.uploaded.get());
  const int classes = layers_.back().units;
  const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;

  // Input: the dense features are in place; each embedding bag into its columns.
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    const Embedding& emb = embeddings_[e];
    if (!emb.wide) {
      kernels_->EmbeddingBagForward(rows[e], in.row_index, in.offsets, b, emb.dim, emb.mean,
                                    input_width_, emb.col, in.x0);
    }
  }
  // Dense layers.
  const float* x = in.x0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    if (hooks.before_layer) hooks.before_layer(static_cast<int>(l));
    kernels_->Gemm(false, false, b, layer.units, layer.in, 1.0f, x, params[2 * l], 0.0f, layer.out);
    kernels_->AddBias(params[2 * l + 1], b, layer.units, layer.out);
    kernels_->ActivationForward(layer.activation, layer.out, int64_t{b} * layer.units, layer.out);
    x = layer.out;
  }
  float* logits = layers_.back().out;
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    if (!embeddings_[e].wide) continue;
    kernels_->EmbeddingBagForward(rows[e], in.row_index, in.offsets, b, classes,
                                  embeddings_[e].mean, classes, 0, wide_out_);
    kernels_->Axpy(int64_t{b} * classes, 1.0f, wide_out_, logits);
  }
  // Loss; its outputs are downloaded while backward runs. The previous step's downloads of
  // loss_ and predictions_ must be over before they are written again.
  kernels_->Wait(compute, outputs_downloaded_.get());
  float* dlogits = layers_.back().dout;
  if (softmax) {
    kernels_->SoftmaxCrossEntropy(logits, in.int_labels, b, classes, loss_, dlogits);
    kernels_->ArgMax(logits, b, classes, predictions_);
  } else {
    kernels_->SigmoidCrossEntropy(logits, in.labels, b, loss_, dlogits);
  }
  const auto down = Kernels::Stream::kDownload;
  kernels_->Record(forward_done_.get(), compute);
  kernels_->Wait(down, forward_done_.get());
  if (outputs.loss != nullptr) kernels_->CopyToHostAsync(down, loss_, outputs.loss, int64_t{b} * 4);
  if (softmax && outputs.predictions != nullptr) {
    kernels_->CopyToHostAsync(down, predictions_, outputs.predictions, int64_t{b} * 4);
  }
  if (!softmax && outputs.logits != nullptr) {
    kernels_->CopyToHostAsync(down, logits, outputs.logits, int64_t{b} * 4);
  }
  kernels_->Record(outputs_downloaded_.get(), down);
  if (outputs.ready != nullptr) kernels_->Record(outputs.ready, down);
  if (!backward) {
    kernels_->Record(in.consumed.get(), compute);
    return absl::OkStatus();
  }

  // Backward: dlogits is the gradient of the mean loss (of this tower's examples, scaled to
  // its share).
  if (hooks.before_backward) hooks.before_backward();
  if (gradient_scale != 1.0f) kernels_->Scale(int64_t{b} * classes, gradient_scale, dlogits);
  const bool towers = static_cast<bool>(hooks.reduce_gradients);
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    Layer& layer = layers_[l];
    const float* input = l == 0 ? in.x0 : layers_[l - 1].out;
    kernels_->ActivationBackward(layer.activation, layer.out, layer.dout, int64_t{b} * layer.units,
                                 layer.dout);
    kernels_->Gemm(true, false, layer.in, layer.units, b, 1.0f, input, layer.dout, 0.0f,
                   layer.dkernel);
    kernels_->BiasGrad(layer.dout, b, layer.units, layer.dbias);
    if (!towers && hooks.gradient_ready) {
      hooks.gradient_ready(2 * l + 1);
      hooks.gradient_ready(2 * l);
    }
    float* dinput = l == 0 ? dx0_ : layers_[l - 1].dout;
    if (l > 0 || !embeddings_.empty()) {
      kernels_->Gemm(false, true, b, layer.in, layer.units, 1.0f, layer.dout, params[2 * l], 0.0f,
                     dinput);
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
                            const std::vector<const float*>& rows, bool backward,
                            StepResult* result) {
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
      Enqueue(kSlot, device_params, device_rows, backward, 1.0f, Hooks(), compute_outputs_));
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
