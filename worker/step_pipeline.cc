#include "worker/step_pipeline.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

constexpr auto kCompute = Kernels::Stream::kCompute;
constexpr auto kUpload = Kernels::Stream::kUpload;
constexpr auto kDownload = Kernels::Stream::kDownload;

}  // namespace

std::vector<int> SplitOverTowers(int b, int n) {
  std::vector<int> sizes(n, b / n);
  for (int t = 0; t < b % n; ++t) ++sizes[t];
  return sizes;
}

absl::Status StageOverTowers(const std::vector<Model*>& towers, int slot,
                             const PreparedBatch& batch) {
  const Batch whole = AsBatch(batch.data);
  if (towers.size() == 1) return towers[0]->StageInputs(slot, whole, batch.sparse);
  const int input_dim = towers[0]->config().input_dim();
  const std::vector<int> sizes = SplitOverTowers(whole.size, static_cast<int>(towers.size()));
  int at = 0;
  for (size_t t = 0; t < towers.size(); ++t) {
    Batch part;
    part.size = sizes[t];
    part.dense = whole.dense + int64_t{at} * input_dim;
    part.labels = whole.labels + at;
    at += sizes[t];
    if (part.size == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a batch of ", whole.size, " examples cannot be split over ", towers.size(), " towers"));
    }
    PS_RETURN_IF_ERROR(towers[t]->StageInputs(slot, part, SparseInput()));
  }
  return absl::OkStatus();
}

absl::Status StageGatheredOverTowers(const std::vector<Model*>& towers, int64_t index,
                                     const Dataset& data, const std::vector<int64_t>& positions,
                                     ThreadPool* pool) {
  const int slot = static_cast<int>(index % Model::kInputSlots);
  if (data.dense_dim != towers[0]->config().input_dim()) {
    return absl::InvalidArgumentError(absl::StrCat("the data has ", data.dense_dim,
                                                   " features; model ", towers[0]->config().name(),
                                                   " takes ", towers[0]->config().input_dim()));
  }
  const int num_towers = static_cast<int>(towers.size());
  const std::vector<int> sizes = SplitOverTowers(static_cast<int>(positions.size()), num_towers);
  std::vector<int> starts(num_towers, 0);
  for (int t = 1; t < num_towers; ++t) starts[t] = starts[t - 1] + sizes[t - 1];
  std::vector<absl::Status> results(num_towers);
  auto gather = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      results[t] = sizes[t] == 0
                       ? absl::InvalidArgumentError(absl::StrCat("a batch of ", positions.size(),
                                                                 " examples cannot be split over ",
                                                                 num_towers, " towers"))
                       : towers[t]->StageGathered(slot, data.dense.data(), data.labels.data(),
                                                  positions.data() + starts[t], sizes[t],
                                                  /*augment_key=*/index + 1);
    }
  };
  if (pool == nullptr || num_towers == 1) {
    gather(0, num_towers);
  } else {
    pool->ParallelFor(num_towers, 1, gather);
  }
  for (const absl::Status& s : results) PS_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

Batch AsBatch(const Dataset& d) {
  Batch b;
  b.size = static_cast<int>(d.num_examples);
  b.dense = d.dense.data();
  if (!d.sparse_offsets.empty()) {
    b.sparse_offsets = d.sparse_offsets.data();
    b.sparse_ids = d.sparse_ids.data();
  }
  b.labels = d.labels.data();
  return b;
}

absl::StatusOr<std::unique_ptr<StepPipeline>> StepPipeline::Create(
    std::vector<Model*> towers, TowerReducer* reducer, ParameterClient* client,
    const StepPipelineOptions& options) {
  if (towers.empty()) return absl::InvalidArgumentError("a step pipeline needs a tower");
  for (Model* m : towers) {
    if (m->dense_variables() != towers[0]->dense_variables() ||
        m->max_batch() != towers[0]->max_batch()) {
      return absl::InvalidArgumentError("the towers of a worker must hold the same model");
    }
  }
  if (towers.size() > 1 && !towers[0]->tables().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", towers[0]->config().name(),
                                                   " has embedding tables; a model with tables "
                                                   "trains on one device, not ",
                                                   towers.size(), " towers"));
  }
  if (towers.size() > 1 && reducer == nullptr) {
    return absl::InvalidArgumentError("towers need a TowerReducer");
  }
  if (options.staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("staleness must be >= 0, got ", options.staleness));
  }
  auto p =
      std::unique_ptr<StepPipeline>(new StepPipeline(std::move(towers), reducer, client, options));
  PS_RETURN_IF_ERROR(p->Allocate());
  p->pull_thread_ = std::thread([raw = p.get()] { raw->PullThread(); });
  p->push_thread_ = std::thread([raw = p.get()] { raw->PushThread(); });
  return p;
}

StepPipeline::StepPipeline(std::vector<Model*> towers, TowerReducer* reducer,
                           ParameterClient* client, const StepPipelineOptions& options)
    : towers_(std::move(towers)),
      reducer_(reducer),
      client_(client),
      options_(options),
      on_host_(towers_[0]->kernels()->device_is_host()),
      per_layer_(options.per_layer < 0 ? options.staleness == 0 : options.per_layer > 0),
      k0_(towers_[0]->kernels()),
      comm_(std::max(1, options.comm_threads)),
      stage_(static_cast<int>(towers_.size()) - 1) {}

StepPipeline::~StepPipeline() {
  {
    // Whatever is queued goes (a failed push stays failed).
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return in_flight_ == 0 || failed_ != nullptr;
    };
    mu_.Await(absl::Condition(&done));
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (pull_thread_.joinable()) pull_thread_.join();
  if (push_thread_.joinable()) push_thread_.join();
  // The device may still read or write the host buffers.
  for (size_t t = 0; t < towers_.size(); ++t) {
    Kernels* k = towers_[t]->kernels();
    for (ParamSlot& slot : params_) {
      for (auto& e : slot.uploaded[t]) k->Synchronize(e.get());
      k->Synchronize(slot.consumed[t].get());
      if (!on_host_) k->Free(slot.device[t]);
    }
  }
  for (GradSlot& g : grads_) {
    for (auto& e : g.downloaded) k0_->Synchronize(e.get());
    for (size_t t = 0; t < towers_.size(); ++t) {
      towers_[t]->kernels()->Synchronize(g.outputs_ready[t].get());
      towers_[t]->kernels()->FreeHost(g.outputs[t].loss);
      towers_[t]->kernels()->FreeHost(g.outputs[t].predictions);
      towers_[t]->kernels()->FreeHost(g.outputs[t].logits);
    }
    k0_->FreeHost(g.host);
    for (float* r : g.host_rows) k0_->FreeHost(r);
  }
  for (ParamSlot& slot : params_) k0_->FreeHost(slot.host);
}

absl::Status StepPipeline::Allocate() {
  const Model& m = *towers_[0];
  for (int g = 0; g < m.num_groups(); ++g) {
    Layer layer;
    for (int i = m.group_first(g); i < m.group_first(g + 1); ++i) {
      layer.variables.push_back(m.dense_variables()[i]);
      layer.indices.push_back(i);
    }
    layers_.push_back(layer);
  }
  tables_ = m.tables();
  table_dims_ = m.table_dims();
  const int64_t total = m.dense_total();
  const int num_layers = static_cast<int>(layers_.size());
  const int num_towers = static_cast<int>(towers_.size());
  for (int s = 0; s < 2; ++s) {
    ParamSlot& slot = params_[s];
    PS_ASSIGN_OR_RETURN(void* host, k0_->AllocateHost(total * int64_t{sizeof(float)}));
    slot.host = static_cast<float*>(host);
    slot.host_rows.resize(tables_.size());
    slot.device_rows.assign(num_towers, std::vector<float*>(tables_.size(), nullptr));
    slot.uploaded.resize(num_towers);
    for (int t = 0; t < num_towers; ++t) {
      Kernels* k = towers_[t]->kernels();
      if (on_host_) {
        slot.device.push_back(slot.host);
      } else {
        PS_ASSIGN_OR_RETURN(float* device, k->AllocateFloats(total));
        slot.device.push_back(device);
      }
      for (int l = 0; l <= num_layers; ++l) slot.uploaded[t].push_back(k->NewEvent());
      slot.consumed.push_back(k->NewEvent());
    }
    slot.ready.assign(num_layers + 1, false);
  }
  grads_.resize(options_.staleness + 1);
  for (GradSlot& g : grads_) {
    PS_ASSIGN_OR_RETURN(void* host, k0_->AllocateHost(total * int64_t{sizeof(float)}));
    g.host = static_cast<float*>(host);
    g.host_rows.assign(tables_.size(), nullptr);
    g.host_rows_capacity.assign(tables_.size(), 0);
    for (size_t v = 0; v < m.dense_variables().size() + tables_.size(); ++v) {
      g.downloaded.push_back(k0_->NewEvent());
    }
    for (int t = 0; t < num_towers; ++t) {
      Kernels* k = towers_[t]->kernels();
      const int64_t b = towers_[t]->max_batch();
      Model::Outputs out;
      PS_ASSIGN_OR_RETURN(void* loss, k->AllocateHost(b * 4));
      PS_ASSIGN_OR_RETURN(void* pred, k->AllocateHost(b * 4));
      PS_ASSIGN_OR_RETURN(void* logits, k->AllocateHost(b * 4));
      out.loss = static_cast<float*>(loss);
      out.predictions = static_cast<int32_t*>(pred);
      out.logits = static_cast<float*>(logits);
      g.outputs_ready.push_back(k->NewEvent());
      out.ready = g.outputs_ready.back().get();
      g.outputs.push_back(out);
    }
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::Stage(int64_t index, const PreparedBatch& batch) {
  return StageOverTowers(towers_, static_cast<int>(index % Model::kInputSlots), batch);
}

absl::Status StepPipeline::StageGathered(int64_t index, const Dataset& data,
                                         const std::vector<int64_t>& positions) {
  return StageGatheredOverTowers(towers_, index, data, positions, &stage_);
}

void StepPipeline::StartPull(int64_t index, int64_t pull_step, std::vector<int64_t> ids) {
  ParamSlot& slot = params_[index % 2];
  absl::MutexLock lock(&mu_);
  slot.index = index;
  slot.error = absl::OkStatus();
  slot.pulling = true;
  std::fill(slot.ready.begin(), slot.ready.end(), false);
  pull_queue_.push_back(PullRequest{index, pull_step, std::move(ids)});
}

void StepPipeline::PullThread() {
  while (true) {
    PullRequest request;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !pull_queue_.empty();
      };
      mu_.Await(absl::Condition(&work));
      if (pull_queue_.empty()) return;
      request = std::move(pull_queue_.front());
      pull_queue_.pop_front();
    }
    ParamSlot& slot = params_[request.index % 2];
    // Staleness k: the parameters of step i hold every push up to step i - 1 - k.
    {
      absl::MutexLock lock(&mu_);
      const int64_t needed = request.index - options_.staleness;
      // A failed push is sent again by the next Run or Drain before it waits for this pull,
      // so waiting for it here keeps the bound without a deadlock.
      auto pushed = [this, needed]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || pushed_ >= needed;
      };
      mu_.Await(absl::Condition(&pushed));
      if (stopping_) {
        slot.pulling = false;
        return;
      }
      slot.staleness = static_cast<int>(request.index - pushed_);
    }
    absl::Status s = PullInto(slot, request.pull_step, request.ids);
    absl::MutexLock lock(&mu_);
    slot.pulling = false;
    if (!s.ok()) slot.error = s;
  }
}

absl::Status StepPipeline::PullInto(ParamSlot& slot, int64_t pull_step,
                                    const std::vector<int64_t>& ids) {
  const Model& m = *towers_[0];
  const int num_layers = static_cast<int>(layers_.size());
  // The host buffer is free once the uploads from it (two steps ago) are done; each device
  // copy once the compute stream is done with that step.
  for (size_t t = 0; t < towers_.size(); ++t) {
    Kernels* k = towers_[t]->kernels();
    for (auto& e : slot.uploaded[t]) k->Synchronize(e.get());
    if (on_host_) k->Synchronize(slot.consumed[t].get());
  }
  std::vector<absl::Status> results(num_layers + 1);
  // One job per layer (or one for them all), and one for the tables. A job's DecrementCount is
  // the last thing it does: the counter, and everything else on this frame, is gone after the
  // last one.
  absl::BlockingCounter done((per_layer_ ? num_layers : 1) + 1);
  const int64_t slot_index = slot.index;
  auto upload = [this, &slot](int t, int64_t offset, int64_t n, int event) {
    Kernels* k = towers_[t]->kernels();
    if (!on_host_) {
      k->Wait(kUpload, slot.consumed[t].get());
      k->CopyToDeviceAsync(kUpload, slot.host + offset, slot.device[t] + offset, n * 4);
    }
    k->Record(slot.uploaded[t][event].get(), kUpload);
  };
  auto mark = [this, &slot, slot_index](int layer) {
    absl::MutexLock lock(&mu_);
    if (slot.index == slot_index) slot.ready[layer] = true;
  };
  if (!per_layer_) {
    // One request per ps task for every variable; uploaded whole.
    comm_.Schedule([&] {
      std::vector<std::vector<float>> values;
      absl::Status s = client_->Pull(m.dense_variables(), &values, pull_step);
      if (s.ok()) {
        for (size_t v = 0; v < values.size(); ++v) {
          std::memcpy(slot.host + m.dense_offsets()[v], values[v].data(),
                      m.dense_sizes()[v] * sizeof(float));
        }
        for (size_t t = 0; t < towers_.size(); ++t) {
          upload(static_cast<int>(t), 0, m.dense_total(), 0);
          for (int l = 1; l < num_layers; ++l) {
            towers_[t]->kernels()->Record(slot.uploaded[t][l].get(), kUpload);
          }
        }
        for (int l = 0; l < num_layers; ++l) mark(l);
      }
      results[0] = s;
      done.DecrementCount();
    });
  }
  // Every layer's request at once, the first layer's first; each is uploaded on arrival.
  for (int l = 0; l < num_layers && per_layer_; ++l) {
    comm_.Schedule([&, l] {
      const Layer& layer = layers_[l];
      std::vector<std::vector<float>> values;
      absl::Status s = client_->Pull(layer.variables, &values, pull_step);
      if (s.ok()) {
        for (size_t j = 0; j < layer.indices.size(); ++j) {
          const int v = layer.indices[j];
          std::memcpy(slot.host + m.dense_offsets()[v], values[j].data(),
                      m.dense_sizes()[v] * sizeof(float));
        }
        const int64_t first = m.dense_offsets()[layer.indices.front()];
        const int64_t last =
            m.dense_offsets()[layer.indices.back()] + m.dense_sizes()[layer.indices.back()];
        for (size_t t = 0; t < towers_.size(); ++t) {
          upload(static_cast<int>(t), first, last - first, l);
        }
        mark(l);
      }
      results[l] = s;
      done.DecrementCount();
    });
  }
  // The tables' rows for the batch's ids.
  comm_.Schedule([&] {
    absl::Status s;
    for (size_t t = 0; t < tables_.size() && s.ok(); ++t) {
      std::vector<float>& rows = slot.host_rows[t];
      rows.resize(ids.size() * table_dims_[t]);
      s = client_->PullRows(tables_[t], ids.data(), static_cast<int64_t>(ids.size()), rows.data(),
                            pull_step);
    }
    if (s.ok()) {
      Kernels* k = k0_;
      for (size_t t = 0; t < tables_.size() && s.ok(); ++t) {
        absl::StatusOr<float*> device =
            towers_[0]->RowBuffer(static_cast<int>(slot_index % Model::kInputSlots),
                                  static_cast<int>(t), static_cast<int64_t>(ids.size()));
        if (!device.ok()) {
          s = device.status();
          break;
        }
        slot.device_rows[0][t] = *device;
        k->CopyToDeviceAsync(kUpload, slot.host_rows[t].data(), *device,
                             static_cast<int64_t>(slot.host_rows[t].size()) * 4);
      }
      for (size_t t = 0; t < towers_.size(); ++t) {
        towers_[t]->kernels()->Record(slot.uploaded[t][num_layers].get(), kUpload);
      }
      if (s.ok()) mark(num_layers);
    }
    results[num_layers] = s;
    done.DecrementCount();
  });
  done.Wait();
  for (const absl::Status& s : results) PS_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status StepPipeline::AwaitLayer(int s, int64_t index, int layer) {
  ParamSlot& slot = params_[s];
  absl::MutexLock lock(&mu_);
  auto settled = [&slot, index, layer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return slot.index != index || slot.ready[layer] || !slot.pulling;
  };
  mu_.Await(absl::Condition(&settled));
  if (slot.index != index) return absl::InternalError("parameter slot taken by another step");
  if (slot.ready[layer]) return absl::OkStatus();
  if (!slot.error.ok()) return slot.error;
  return absl::InternalError(
      absl::StrCat("the pull of step ", index, " ended without layer ", layer));
}

absl::Status StepPipeline::RetryFailedPush() {
  std::unique_ptr<PushJob> retry;
  {
    absl::MutexLock lock(&mu_);
    if (failed_ == nullptr) return absl::OkStatus();
    // The push thread has stopped at it: the jobs behind it wait, in order, until it is done.
    retry = std::move(failed_);
    failed_status_ = absl::OkStatus();
    retrying_ = true;
  }
  absl::Status s = Push(*retry);
  absl::MutexLock lock(&mu_);
  retrying_ = false;
  if (!s.ok()) {
    failed_ = std::move(retry);
    failed_status_ = s;
    return s;
  }
  LOG(INFO) << "the push of step " << retry->tag << " went through on a retry";
  Collect(*retry);
  --in_flight_;
  ++pushed_;
  return absl::OkStatus();
}

absl::Status StepPipeline::Run(int64_t index, int64_t tag, int64_t pull_step,
                               const PreparedBatch& batch) {
  // A push that failed goes again first, with its ids: it is applied once at most.
  PS_RETURN_IF_ERROR(RetryFailedPush());

  const int ps = static_cast<int>(index % 2);
  ParamSlot& slot = params_[ps];
  bool pulled = false;
  {
    absl::MutexLock lock(&mu_);
    pulled = slot.index == index && (slot.pulling || slot.error.ok());
    if (slot.index == index && !slot.pulling && !slot.error.ok()) {
      // The prefetch failed: pull again below.
      slot.index = -1;
    }
  }
  if (!pulled) StartPull(index, pull_step, batch.sparse.unique_ids);

  const int num_layers = static_cast<int>(layers_.size());
  const int num_dense = static_cast<int>(towers_[0]->dense_variables().size());
  const int in_slot = static_cast<int>(index % Model::kInputSlots);
  // Gradients go to the slot of step index; it is free once step index - (k + 1) was pushed.
  const int gs = static_cast<int>(index % static_cast<int64_t>(grads_.size()));
  {
    absl::MutexLock lock(&mu_);
    const int64_t needed = index - static_cast<int64_t>(grads_.size()) + 1;
    auto free = [this, needed]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return pushed_ >= needed || failed_ != nullptr;
    };
    mu_.Await(absl::Condition(&free));
    if (failed_ != nullptr) return failed_status_;
  }
  GradSlot& g = grads_[gs];
  const int num_towers = static_cast<int>(towers_.size());
  std::vector<int> sizes;
  absl::Status pull_error;
  for (int t = 0; t < num_towers; ++t) {
    Model& model = *towers_[t];
    Kernels* k = model.kernels();
    sizes.push_back(model.staged_size(in_slot));
    std::vector<const float*> params(num_dense);
    for (int v = 0; v < num_dense; ++v) {
      params[v] = slot.device[t] + towers_[0]->dense_offsets()[v];
    }
    std::vector<const float*> rows(tables_.size(), nullptr);
    if (!tables_.empty()) {
      // Rows are needed by the first kernel: wait for them.
      pull_error = AwaitLayer(ps, index, num_layers);
      if (!pull_error.ok()) break;
      k->Wait(kCompute, slot.uploaded[t][num_layers].get());
      for (size_t j = 0; j < tables_.size(); ++j) rows[j] = slot.device_rows[t][j];
    }
    Model::Hooks hooks;
    hooks.before_layer = [&, t, k](int layer) {
      if (!pull_error.ok()) return;
      pull_error = AwaitLayer(ps, index, layer);
      if (pull_error.ok()) k->Wait(kCompute, slot.uploaded[t][layer].get());
    };
    if (t == 0) {
      hooks.before_backward = [&, k] {
        // The previous step's gradients must have left the device buffer.
        for (auto& e : grads_[(gs + grads_.size() - 1) % grads_.size()].downloaded) {
          k->Wait(kCompute, e.get());
        }
      };
      if (num_towers == 1) {
        hooks.gradient_ready = [&, k](int v) {
          // One event for the compute stream's point, reused as the download's start.
          k->Record(g.downloaded[v].get(), kCompute);
          k->Wait(kDownload, g.downloaded[v].get());
          if (v < num_dense) {
            const int64_t off = model.dense_offsets()[v];
            k->CopyToHostAsync(kDownload, model.device_grads() + off, g.host + off,
                               model.dense_sizes()[v] * 4);
          }
          k->Record(g.downloaded[v].get(), kDownload);
        };
      }
    }
    if (!tables_.empty()) {
      // Row gradients land in a page-locked buffer sized for this batch.
      for (size_t j = 0; j < tables_.size(); ++j) {
        const int64_t n = model.staged_rows(in_slot) * table_dims_[j];
        if (g.host_rows_capacity[j] < n) {
          k0_->Synchronize(g.downloaded[num_dense + j].get());
          k0_->FreeHost(g.host_rows[j]);
          const int64_t grown = std::max(n, 2 * g.host_rows_capacity[j]);
          PS_ASSIGN_OR_RETURN(void* p, k0_->AllocateHost(grown * 4));
          g.host_rows[j] = static_cast<float*>(p);
          g.host_rows_capacity[j] = grown;
        }
      }
      auto dense_ready = hooks.gradient_ready;
      hooks.gradient_ready = [&, dense_ready, k](int v) {
        if (v < num_dense) {
          if (dense_ready) dense_ready(v);
          return;
        }
        const int j = v - num_dense;
        k->Record(g.downloaded[v].get(), kCompute);
        k->Wait(kDownload, g.downloaded[v].get());
        k->CopyToHostAsync(kDownload, model.device_row_grads(j), g.host_rows[j],
                           model.staged_rows(in_slot) * table_dims_[j] * 4);
        k->Record(g.downloaded[v].get(), kDownload);
      };
    }
    const float scale = num_towers == 1 ? 1.0f
                                        : static_cast<float>(sizes[t]) /
                                              static_cast<float>(batch.data.num_examples);
    absl::Status s =
        model.Enqueue(in_slot, params, rows, Model::Pass::kTraining, scale, hooks, g.outputs[t]);
    if (!pull_error.ok()) break;
    PS_RETURN_IF_ERROR(s);
    k->Record(slot.consumed[t].get(), kCompute);
  }
  if (!pull_error.ok()) {
    // Wait for the rest of the pull before the slot can be reused.
    absl::MutexLock lock(&mu_);
    auto done = [&slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !slot.pulling; };
    mu_.Await(absl::Condition(&done));
    slot.index = -1;
    return pull_error;
  }
  if (num_towers > 1) {
    // Tower gradients summed in place on every device; tower 0's are pushed.
    std::vector<float*> buffers;
    for (Model* m : towers_) buffers.push_back(m->device_grads());
    PS_RETURN_IF_ERROR(reducer_->AllReduceSum(buffers, towers_[0]->dense_total()));
    Model& m0 = *towers_[0];
    for (int v = num_dense - 1; v >= 0; --v) {
      k0_->Record(g.downloaded[v].get(), kCompute);
      k0_->Wait(kDownload, g.downloaded[v].get());
      const int64_t off = m0.dense_offsets()[v];
      k0_->CopyToHostAsync(kDownload, m0.device_grads() + off, g.host + off,
                           m0.dense_sizes()[v] * 4);
      k0_->Record(g.downloaded[v].get(), kDownload);
    }
  }

  PushJob job;
  job.index = index;
  job.tag = tag;
  job.grad_slot = gs;
  job.tower_sizes = sizes;
  job.labels = batch.data.labels;
  job.unique_ids = batch.sparse.unique_ids;
  {
    absl::MutexLock lock(&mu_);
    job.staleness = slot.staleness;
    max_staleness_ = std::max(max_staleness_, slot.staleness);
    ++in_flight_;
    push_queue_.push_back(std::move(job));
  }
  if (options_.staleness == 0) {
    // Nothing overlaps across steps: the step ends with its pushes.
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return in_flight_ == 0 || failed_ != nullptr;
    };
    mu_.Await(absl::Condition(&done));
    if (failed_ != nullptr) return failed_status_;
    return absl::OkStatus();
  }
  // The next step's parameters, while this one computes and pushes. Its rows need its batch,
  // which is not known yet: a model with tables pulls them at its Run.
  if (tables_.empty()) StartPull(index + 1, -1, {});
  return absl::OkStatus();
}

void StepPipeline::PushThread() {
  while (true) {
    PushJob* job = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || (!push_queue_.empty() && failed_ == nullptr && !retrying_);
      };
      mu_.Await(absl::Condition(&work));
      if (push_queue_.empty() || failed_ != nullptr || retrying_) return;
      job = &push_queue_.front();
    }
    if (options_.push_delay > absl::ZeroDuration()) options_.clock->SleepFor(options_.push_delay);
    absl::Status s = Push(*job);
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      LOG(WARNING) << "the push of step " << job->tag << " failed (" << s
                   << "); the next step sends it again";
      failed_ = std::make_unique<PushJob>(std::move(push_queue_.front()));
      failed_status_ = s;
      push_queue_.pop_front();
      // Later jobs wait behind it; they are pushed after it, in order.
      continue;
    }
    Collect(*job);
    push_queue_.pop_front();
    --in_flight_;
    ++pushed_;
  }
}

absl::Status StepPipeline::Push(PushJob& job) {
  GradSlot& g = grads_[job.grad_slot];
  const Model& m = *towers_[0];
  const int num_dense = static_cast<int>(m.dense_variables().size());
  const int num_layers = static_cast<int>(layers_.size());
  job.tickets.resize(num_layers + tables_.size());
  std::vector<absl::Status> results(num_layers + tables_.size());
  // One job per layer (or one for them all) and per table; each job's DecrementCount is the
  // last thing it does (this frame is gone after the last one).
  absl::BlockingCounter done((per_layer_ ? num_layers : 1) + static_cast<int>(tables_.size()));
  if (!per_layer_) {
    // Every gradient in one request per ps task, once all are on the host.
    for (int v = 0; v < num_dense; ++v) k0_->Synchronize(g.downloaded[v].get());
    comm_.Schedule([&] {
      std::vector<const float*> grads;
      for (int v = 0; v < num_dense; ++v) grads.push_back(g.host + m.dense_offsets()[v]);
      results[0] = client_->Push(m.dense_variables(), grads, job.tag, &job.tickets[0]);
      done.DecrementCount();
    });
  }
  // Last layer first: each layer's gradients go as soon as they are on the host.
  for (int l = num_layers - 1; l >= 0 && per_layer_; --l) {
    const Layer& layer = layers_[l];
    for (int v : layer.indices) k0_->Synchronize(g.downloaded[v].get());
    comm_.Schedule([&, l] {
      const Layer& lay = layers_[l];
      std::vector<const float*> grads;
      for (int v : lay.indices) grads.push_back(g.host + m.dense_offsets()[v]);
      results[l] = client_->Push(lay.variables, grads, job.tag, &job.tickets[l]);
      done.DecrementCount();
    });
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    k0_->Synchronize(g.downloaded[num_dense + t].get());
    comm_.Schedule([&, t] {
      results[num_layers + t] = client_->PushRows(
          tables_[t], job.unique_ids.data(), static_cast<int64_t>(job.unique_ids.size()),
          g.host_rows[t], job.tag, &job.tickets[num_layers + t]);
      done.DecrementCount();
    });
  }
  done.Wait();
  for (const absl::Status& s : results) PS_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

void CountOutputs(const Model::Outputs& o, int n, const float* labels, bool softmax,
                  StepOutcome* out) {
  for (int i = 0; i < n; ++i) {
    out->loss_sum += o.loss[i];
    out->correct += softmax ? o.predictions[i] == static_cast<int32_t>(labels[i])
                            : (o.logits[i] > 0) == (labels[i] > 0.5f);
  }
  out->examples += n;
}

void StepPipeline::Collect(const PushJob& job) {
  GradSlot& g = grads_[job.grad_slot];
  const bool softmax = towers_[0]->config().loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  StepOutcome out;
  out.index = job.index;
  out.tag = job.tag;
  out.staleness = job.staleness;
  for (size_t t = 0; t < towers_.size(); ++t) {
    towers_[t]->kernels()->Synchronize(g.outputs_ready[t].get());
    CountOutputs(g.outputs[t], job.tower_sizes[t], job.labels.data() + out.examples, softmax, &out);
  }
  outcomes_.push_back(out);
}

absl::Status StepPipeline::Drain() {
  PS_RETURN_IF_ERROR(RetryFailedPush());
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ == 0 || failed_ != nullptr;
  };
  mu_.Await(absl::Condition(&done));
  if (failed_ != nullptr) return failed_status_;
  return absl::OkStatus();
}

int StepPipeline::pushes_in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

void StepPipeline::Invalidate() {
  absl::MutexLock lock(&mu_);
  for (ParamSlot& slot : params_) {
    auto done = [&slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !slot.pulling; };
    mu_.Await(absl::Condition(&done));
    slot.index = -1;
  }
}

std::vector<StepOutcome> StepPipeline::TakeOutcomes() {
  absl::MutexLock lock(&mu_);
  std::vector<StepOutcome> out;
  out.swap(outcomes_);
  return out;
}

int StepPipeline::max_staleness() const {
  absl::MutexLock lock(&mu_);
  return max_staleness_;
}

}  // namespace pscluster
