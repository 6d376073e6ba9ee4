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
#include "model/layer.h"

namespace pscluster {

bool HasNetwork(const v1::ModelConfig& config) {
  return config.layers_size() > 0 || config.network_size() > 0;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const v1::ModelConfig& config,
                                                     Kernels* kernels, int max_batch,
                                                     bool keep_patches) {
  PS_ASSIGN_OR_RETURN(Plan plan, MakePlan(config));
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch must be >= 1, got ", max_batch));
  }
  auto model = std::unique_ptr<Model>(new Model(config, kernels, max_batch));
  model->keep_patches_ = keep_patches;
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
  tensor_values_.assign(tensors_.size(), nullptr);
  tensor_grads_.assign(tensors_.size(), nullptr);
  for (size_t t = 1; t < tensors_.size(); ++t) {
    PS_ASSIGN_OR_RETURN(tensors_[t].value, Floats(b * tensors_[t].size));
    PS_ASSIGN_OR_RETURN(tensors_[t].grad, Floats(b * tensors_[t].size));
    tensor_values_[t] = tensors_[t].value;
    tensor_grads_[t] = tensors_[t].grad;
    largest = std::max(largest, tensors_[t].size);
  }
  int64_t cols = 0;
  for (Node& node : nodes_) {
    int32_t* ints = nullptr;
    float* stats = nullptr;
    if (const int64_t n = node.layer->IndexInts(node); n > 0) {
      PS_ASSIGN_OR_RETURN(ints, Ints(b * n));
    }
    if (const int64_t n = node.layer->StatFloats(node); n > 0) {
      PS_ASSIGN_OR_RETURN(stats, Floats(n));
    }
    node.layer->Bind(&node, ints, stats);
    const int64_t patches = b * node.layer->PatchFloats(node);
    cols = std::max(cols, patches);
    if (keep_patches_ && patches > 0) {
      PS_ASSIGN_OR_RETURN(node.patches, Floats(patches));
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
  const auto compute = Kernels::Stream::kCompute;
  std::vector<bool> written(tensors_.size(), false);
  StepContext ctx;
  ctx.kernels = kernels_;
  ctx.batch = in.size;
  ctx.training = pass != Pass::kInference;
  ctx.gradient_scale = gradient_scale;
  ctx.params = params.data();
  ctx.grads = grads_;
  ctx.grad_offsets = dense_offsets_.data();
  ctx.cols = cols_;
  ctx.accum = accum_;
  ctx.input = in.x0;
  ctx.input_grad = need_input_grad_ ? dx0_ : nullptr;
  ctx.values = &tensor_values_;
  ctx.gradients = &tensor_grads_;
  ctx.written = &written;
  Forward(slot, rows, hooks, ctx);
  // Loss; its outputs are downloaded while backward runs (a captured step: after it). The
  // downloads of the step that last used this slot's outputs must be over before they are
  // written again.
  if (outputs != nullptr) kernels_->Wait(compute, step_outputs_[slot].downloaded.get());
  Loss(slot);
  if (outputs != nullptr) DownloadOutputs(slot, *outputs);
  if (pass != Pass::kTraining) {
    if (outputs != nullptr) kernels_->Record(in.consumed.get(), compute);
    return absl::OkStatus();
  }
  PS_RETURN_IF_ERROR(Backward(slot, hooks, ctx));
  if (outputs == nullptr) return absl::OkStatus();  // captured: the caller records
  kernels_->Record(in.consumed.get(), compute);
  if (hooks.reduce_gradients) {
    // Towers: every gradient is ready once they are summed.
    PS_RETURN_IF_ERROR(hooks.reduce_gradients());
    if (hooks.gradient_ready) {
      const int num_dense = static_cast<int>(dense_names_.size());
      for (int v = num_dense - 1; v >= 0; --v) hooks.gradient_ready(v);
      for (size_t e = 0; e < embeddings_.size(); ++e) {
        hooks.gradient_ready(num_dense + static_cast<int>(e));
      }
    }
  }
  kernels_->Record(gradient_done_.get(), compute);
  return absl::OkStatus();
}

void Model::Forward(int slot, const std::vector<const float*>& rows, const Hooks& hooks,
                    const StepContext& ctx) {
  const Inputs& in = inputs_[slot];
  const int b = in.size;
  const int classes = classes_;
  if (in.resident) {
    const bool softmax = config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
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
    node.layer->Forward(ctx, node);
    if (!node.layer->is_activation() && node.activation != Activation::kLinear) {
      float* y = ctx.value(node.output);
      kernels_->ActivationForward(node.activation, y, b * node.out.size(), y);
    }
  }
  float* logits = ctx.value(nodes_.back().output);
  for (size_t e = 0; e < embeddings_.size(); ++e) {
    if (!embeddings_[e].wide) continue;
    kernels_->EmbeddingBagForward(rows[e], in.row_index, in.offsets, b, classes,
                                  embeddings_[e].mean, classes, 0, wide_out_);
    kernels_->Axpy(int64_t{b} * classes, 1.0f, wide_out_, logits);
  }
}

void Model::Loss(int slot) {
  const Inputs& in = inputs_[slot];
  const int b = in.size;
  const StepOutputs& o = step_outputs_[slot];
  // The logits are never the input (the last layer computes them): they have their own tensor.
  const int logits_tensor = nodes_.back().output;
  const float* logits = tensor_values_[logits_tensor];
  float* dlogits = tensor_grads_[logits_tensor];
  if (config_.loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY) {
    kernels_->SoftmaxCrossEntropy(logits, in.int_labels, b, classes_, o.loss, dlogits);
    kernels_->ArgMax(logits, b, classes_, o.predictions);
  } else {
    kernels_->SigmoidCrossEntropy(logits, in.labels, b, o.loss, dlogits);
    // The next step's forward writes the logits while these go to the host.
    kernels_->ScaleCopy(b, 1.0f, logits, o.logits);
  }
}

absl::Status Model::Backward(int slot, const Hooks& hooks, const StepContext& ctx) {
  const Inputs& in = inputs_[slot];
  const int b = in.size;
  const int classes = classes_;
  const int logits_tensor = nodes_.back().output;
  float* dlogits = tensor_grads_[logits_tensor];
  // dlogits is the gradient of the mean loss (of this tower's examples, scaled to its share). A
  // layer writes the gradient of each tensor it reads; the first writer of a tensor writes it in
  // place, later ones (a tensor read twice, as a residual block's input) write accum_ and add it.
  if (hooks.before_backward) hooks.before_backward();
  if (ctx.gradient_scale != 1.0f) {
    kernels_->Scale(int64_t{b} * classes, ctx.gradient_scale, dlogits);
  }
  // With towers the gradients are ready only once they are summed (Enqueue).
  const bool each_ready = !hooks.reduce_gradients && hooks.gradient_ready;
  (*ctx.written)[logits_tensor] = true;
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    Node& node = *it;
    if (node.layer->aliases_input()) continue;
    if (!node.layer->is_activation() && node.activation != Activation::kLinear) {
      float* dy = ctx.grad(node.output);
      kernels_->ActivationBackward(node.activation, ctx.value(node.output), dy, b * node.out.size(),
                                   dy);
    }
    node.layer->Backward(ctx, node);
    if (each_ready) {
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
    if (each_ready) hooks.gradient_ready(num_dense + static_cast<int>(e));
  }
  return absl::OkStatus();
}

absl::Status Model::Compute(const Batch& batch, const SparseInput& sparse,
                            const std::vector<const float*>& params,
                            const std::vector<const float*>& rows, Pass pass, StepResult* result) {
  if (params.size() != dense_names_.size() || rows.size() != embeddings_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("got ", params.size(), " dense variables and ", rows.size(),
                     " tables; the model has ", dense_names_.size(), " and ", embeddings_.size()));
  }
  constexpr int kSlot = 0;
  PS_RETURN_IF_ERROR(StageInputs(kSlot, batch, sparse));
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
  PS_RETURN_IF_ERROR(AllocateComputeOutputs());
  PS_RETURN_IF_ERROR(
      Enqueue(kSlot, device_params, device_rows, pass, 1.0f, Hooks(), compute_outputs_));
  kernels_->Synchronize(compute_ready_.get());
  ReadComputeResult(batch, pass == Pass::kTraining, num_rows, result);
  return absl::OkStatus();
}

absl::Status Model::AllocateComputeOutputs() {
  if (compute_outputs_.loss != nullptr) return absl::OkStatus();
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
  return absl::OkStatus();
}

void Model::ReadComputeResult(const Batch& batch, bool backward, int64_t num_rows,
                              StepResult* result) {
  const int b = batch.size;
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
  if (!backward) return;
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
}

}  // namespace pscluster
