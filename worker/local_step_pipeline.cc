#include "worker/local_step_pipeline.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

constexpr auto kCompute = Kernels::Stream::kCompute;
constexpr auto kUpload = Kernels::Stream::kUpload;
constexpr auto kDownload = Kernels::Stream::kDownload;

absl::StatusOr<ElementwiseUpdate::Kind> KindOf(const Optimizer& optimizer) {
  using Kind = ElementwiseUpdate::Kind;
  const absl::string_view name = optimizer.name();
  if (name == "sgd") return Kind::kSgd;
  if (name == "momentum") return Kind::kMomentum;
  if (name == "adam") return Kind::kAdam;
  if (name == "moving_average") return Kind::kMovingAverage;
  return absl::UnimplementedError(absl::StrCat(
      "local steps run the optimizers on the worker's device, which has sgd, momentum, adam and "
      "moving_average; not ",
      name));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalStepPipeline>> LocalStepPipeline::Create(
    Model* model, ParameterClient* client, const v1::ModelSpec& spec, int local_steps,
    int num_workers) {
  if (local_steps < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("local steps must be >= 2 (1: push every step), got ", local_steps));
  }
  if (!model->tables().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", model->config().name(),
                     " has embedding tables; local steps keep dense variables only on the worker"));
  }
  if (num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers must be >= 1, got ", num_workers));
  }
  auto p = std::unique_ptr<LocalStepPipeline>(
      new LocalStepPipeline(model, client, local_steps, num_workers));
  PS_RETURN_IF_ERROR(p->Allocate(spec));
  p->comm_thread_ = std::thread([raw = p.get()] { raw->CommThread(); });
  return p;
}

LocalStepPipeline::LocalStepPipeline(Model* model, ParameterClient* client, int local_steps,
                                     int num_workers)
    : model_(model),
      client_(client),
      k_(model->kernels()),
      local_steps_(local_steps),
      num_workers_(num_workers),
      delta_scale_(1.0f / static_cast<float>(num_workers)),
      n_(model->dense_total()) {}

LocalStepPipeline::~LocalStepPipeline() {
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sync_ != Sync::kPushing; };
    mu_.Await(absl::Condition(&idle));
    stopping_ = true;
  }
  if (comm_thread_.joinable()) comm_thread_.join();
  // The device may still read or write the buffers. (A Create that failed part way made some
  // of the events, or none.)
  auto synchronize = [this](const std::unique_ptr<Kernels::Event>& e) {
    if (e != nullptr) k_->Synchronize(e.get());
  };
  for (const auto& e : outputs_ready_) synchronize(e);
  synchronize(delta_downloaded_);
  synchronize(fresh_uploaded_);
  synchronize(fresh_consumed_);
  for (void* p : {static_cast<void*>(host_delta_), static_cast<void*>(host_fresh_)}) {
    if (p != nullptr) k_->FreeHost(p);
  }
  for (Model::Outputs& o : outputs_) {
    for (void* p : {static_cast<void*>(o.loss), static_cast<void*>(o.predictions),
                    static_cast<void*>(o.logits)}) {
      if (p != nullptr) k_->FreeHost(p);
    }
  }
  for (void* p : owned_) k_->Free(p);
}

absl::Status LocalStepPipeline::Allocate(const v1::ModelSpec& spec) {
  const std::vector<std::string>& names = model_->dense_variables();
  // Each variable's optimizer, by name; consecutive variables with the same spec form a group.
  const v1::OptimizerSpec* last = nullptr;
  for (size_t v = 0; v < names.size(); ++v) {
    const v1::VariableSpec* var = nullptr;
    for (const v1::VariableSpec& s : spec.variables()) {
      if (s.name() == names[v]) var = &s;
    }
    if (var == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", names[v], " of the model is not in the model spec"));
    }
    const int64_t offset = model_->dense_offsets()[v];
    const int64_t size = model_->dense_sizes()[v];
    if (last != nullptr && last->SerializeAsString() == var->optimizer().SerializeAsString()) {
      groups_.back().size += size;
      continue;
    }
    UpdateGroup g;
    g.offset = offset;
    g.size = size;
    PS_ASSIGN_OR_RETURN(g.optimizer, Optimizer::Create(var->optimizer()));
    PS_ASSIGN_OR_RETURN(g.kind, KindOf(*g.optimizer));
    groups_.push_back(std::move(g));
    last = &var->optimizer();
  }
  auto floats = [this](int64_t n) -> absl::StatusOr<float*> {
    PS_ASSIGN_OR_RETURN(float* p, k_->AllocateFloats(std::max<int64_t>(n, 1)));
    owned_.push_back(p);
    return p;
  };
  for (float** b : {&local_, &base_, &snap_, &delta_, &fresh_}) {
    PS_ASSIGN_OR_RETURN(*b, floats(n_));
  }
  for (UpdateGroup& g : groups_) {
    // Every kind here starts its slots at 0.
    const int slots = g.optimizer->num_slots();
    if (slots >= 1) {
      PS_ASSIGN_OR_RETURN(g.slot0, floats(g.size));
      k_->Fill(g.slot0, g.size, 0.0f);
    }
    if (slots >= 2) {
      PS_ASSIGN_OR_RETURN(g.slot1, floats(g.size));
      k_->Fill(g.slot1, g.size, 0.0f);
    }
  }
  PS_ASSIGN_OR_RETURN(void* delta, k_->AllocateHost(std::max<int64_t>(n_, 1) * 4));
  host_delta_ = static_cast<float*>(delta);
  PS_ASSIGN_OR_RETURN(void* fresh, k_->AllocateHost(std::max<int64_t>(n_, 1) * 4));
  host_fresh_ = static_cast<float*>(fresh);
  delta_downloaded_ = k_->NewEvent();
  fresh_uploaded_ = k_->NewEvent();
  fresh_consumed_ = k_->NewEvent();
  const int64_t b = model_->max_batch();
  for (int s = 0; s < kOutputSlots; ++s) {
    PS_ASSIGN_OR_RETURN(void* loss, k_->AllocateHost(b * 4));
    PS_ASSIGN_OR_RETURN(void* pred, k_->AllocateHost(b * 4));
    PS_ASSIGN_OR_RETURN(void* logits, k_->AllocateHost(b * 4));
    outputs_[s].loss = static_cast<float*>(loss);
    outputs_[s].predictions = static_cast<int32_t*>(pred);
    outputs_[s].logits = static_cast<float*>(logits);
    outputs_ready_[s] = k_->NewEvent();
    outputs_[s].ready = outputs_ready_[s].get();
  }
  return absl::OkStatus();
}

absl::Status LocalStepPipeline::Stage(int64_t index, const PreparedBatch& batch) {
  return model_->StageInputs(static_cast<int>(index % Model::kInputSlots), AsBatch(batch.data),
                             batch.sparse);
}

absl::Status LocalStepPipeline::StageGathered(int64_t index, const Dataset& data,
                                              const std::vector<int64_t>& positions) {
  if (data.dense_dim != model_->config().input_dim()) {
    return absl::InvalidArgumentError(absl::StrCat("the data has ", data.dense_dim,
                                                   " features; model ", model_->config().name(),
                                                   " takes ", model_->config().input_dim()));
  }
  return model_->StageGathered(static_cast<int>(index % Model::kInputSlots), data.dense.data(),
                               data.labels.data(), positions.data(),
                               static_cast<int>(positions.size()), /*augment_key=*/index + 1);
}

absl::Status LocalStepPipeline::PullFresh() {
  std::vector<std::vector<float>> values;
  PS_RETURN_IF_ERROR(client_->Pull(model_->dense_variables(), &values));
  // The previous upload from host_fresh_ must be done before it is written.
  k_->Synchronize(fresh_uploaded_.get());
  for (size_t v = 0; v < values.size(); ++v) {
    std::memcpy(host_fresh_ + model_->dense_offsets()[v], values[v].data(),
                model_->dense_sizes()[v] * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status LocalStepPipeline::PushAndPull() {
  std::vector<const float*> deltas;
  for (int64_t offset : model_->dense_offsets()) deltas.push_back(host_delta_ + offset);
  int64_t tag;
  {
    absl::MutexLock lock(&mu_);
    tag = sync_tag_;
  }
  PS_RETURN_IF_ERROR(client_->PushDelta(model_->dense_variables(), deltas, tag, &ticket_));
  return PullFresh();
}

void LocalStepPipeline::CommThread() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || queued_; };
      mu_.Await(absl::Condition(&work));
      if (stopping_) return;
      queued_ = false;
    }
    k_->Synchronize(delta_downloaded_.get());
    absl::Status s = PushAndPull();
    absl::MutexLock lock(&mu_);
    sync_status_ = s;
    sync_ = s.ok() ? Sync::kDone : Sync::kFailed;
    if (!s.ok()) {
      LOG(WARNING) << "the delta of the local steps up to step " << sync_tag_ << " was not pushed ("
                   << s << "); the next step sends it again";
    }
  }
}

void LocalStepPipeline::StartSync(int64_t tag) {
  // delta = (local - base) / workers, taken now; the local copy goes on changing meanwhile.
  k_->ScaleCopy(n_, 1.0f, local_, snap_);
  k_->ScaleCopy(n_, 1.0f, local_, delta_);
  k_->Axpy(n_, -1.0f, base_, delta_);
  if (delta_scale_ != 1.0f) k_->Scale(n_, delta_scale_, delta_);
  k_->Record(delta_downloaded_.get(), kCompute);
  k_->Wait(kDownload, delta_downloaded_.get());
  k_->CopyToHostAsync(kDownload, delta_, host_delta_, n_ * 4);
  k_->Record(delta_downloaded_.get(), kDownload);
  ticket_ = PushTicket();
  absl::MutexLock lock(&mu_);
  sync_tag_ = tag;
  sync_ = Sync::kPushing;
  queued_ = true;
  since_sync_ = 0;
}

absl::Status LocalStepPipeline::Merge(bool wait) {
  {
    absl::MutexLock lock(&mu_);
    if (wait) {
      auto settled = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sync_ != Sync::kPushing; };
      mu_.Await(absl::Condition(&settled));
    }
    if (sync_ == Sync::kFailed) return sync_status_;
    if (sync_ != Sync::kDone) return absl::OkStatus();
  }
  // host_fresh_: the ps's values with the delta in. local = fresh + (local - snapshot), base =
  // fresh.
  k_->Wait(kUpload, fresh_consumed_.get());
  k_->CopyToDeviceAsync(kUpload, host_fresh_, fresh_, n_ * 4);
  k_->Record(fresh_uploaded_.get(), kUpload);
  k_->Wait(kCompute, fresh_uploaded_.get());
  k_->ScaleCopy(n_, 1.0f, fresh_, base_);
  k_->Axpy(n_, -1.0f, snap_, fresh_);
  k_->Axpy(n_, 1.0f, fresh_, local_);
  k_->Record(fresh_consumed_.get(), kCompute);
  absl::MutexLock lock(&mu_);
  sync_ = Sync::kNone;
  since_refresh_ = since_sync_;
  return absl::OkStatus();
}

absl::Status LocalStepPipeline::RetrySync() {
  {
    absl::MutexLock lock(&mu_);
    if (sync_ != Sync::kFailed) return absl::OkStatus();
  }
  absl::Status s = PushAndPull();
  absl::MutexLock lock(&mu_);
  sync_status_ = s;
  if (s.ok()) {
    sync_ = Sync::kDone;
    LOG(INFO) << "the delta of the local steps up to step " << sync_tag_
              << " went through on a retry";
  }
  return s;
}

absl::Status LocalStepPipeline::ApplyLocalUpdate(int64_t tag) {
  ++local_updates_;
  const float* grads = model_->device_grads();
  for (UpdateGroup& g : groups_) {
    // The ps's decay counts every worker's updates; the granted step counts this worker's.
    const int64_t decay_t = std::max<int64_t>(tag, 0) * num_workers_ + 1;
    PS_ASSIGN_OR_RETURN(const Optimizer::Constants c,
                        g.optimizer->ConstantsAt(local_updates_, decay_t));
    ElementwiseUpdate u;
    u.kind = g.kind;
    u.lr = c.lr;
    u.beta1 = c.beta1;
    u.beta2 = c.beta2;
    u.epsilon = c.epsilon;
    u.momentum = c.momentum;
    u.nesterov = c.nesterov;
    k_->ApplyUpdate(u, g.size, grads + g.offset, local_ + g.offset, g.slot0, g.slot1);
  }
  return absl::OkStatus();
}

absl::Status LocalStepPipeline::Run(int64_t index, int64_t tag, int64_t /*pull_step*/,
                                    const PreparedBatch& batch) {
  PS_RETURN_IF_ERROR(RetrySync());
  if (!have_params_) {
    PS_RETURN_IF_ERROR(PullFresh());
    k_->Wait(kUpload, fresh_consumed_.get());
    k_->CopyToDeviceAsync(kUpload, host_fresh_, base_, n_ * 4);
    k_->Record(fresh_uploaded_.get(), kUpload);
    k_->Wait(kCompute, fresh_uploaded_.get());
    k_->ScaleCopy(n_, 1.0f, base_, local_);
    have_params_ = true;
    since_refresh_ = 0;
    absl::MutexLock lock(&mu_);
    since_sync_ = 0;
  }
  int unsynced;
  {
    absl::MutexLock lock(&mu_);
    unsynced = since_sync_;
  }
  if (unsynced >= local_steps_) {
    // The last K steps go to the ps; the sync before them must have been folded in first.
    PS_RETURN_IF_ERROR(Merge(/*wait=*/true));
    StartSync(last_tag_);
  } else {
    PS_RETURN_IF_ERROR(Merge(/*wait=*/false));
  }

  const int slot = static_cast<int>(index % kOutputSlots);
  // The outputs of the step that used this slot must be on the host first.
  CollectOutcomes(kOutputSlots - 1);
  std::vector<const float*> params;
  for (int64_t offset : model_->dense_offsets()) params.push_back(local_ + offset);
  PS_RETURN_IF_ERROR(model_->Enqueue(static_cast<int>(index % Model::kInputSlots), params, {},
                                     Model::Pass::kTraining, 1.0f, Model::Hooks(), outputs_[slot]));
  PS_RETURN_IF_ERROR(ApplyLocalUpdate(tag));
  Pending p;
  p.index = index;
  p.tag = tag;
  p.slot = slot;
  p.labels = batch.data.labels;
  p.staleness = since_refresh_;
  pending_.push_back(std::move(p));
  ++since_refresh_;
  last_tag_ = tag;
  absl::MutexLock lock(&mu_);
  ++since_sync_;
  max_staleness_ = std::max(max_staleness_, pending_.back().staleness);
  return absl::OkStatus();
}

void LocalStepPipeline::CollectOutcomes(size_t keep) {
  const bool softmax = model_->config().loss() == v1::ModelConfig::SOFTMAX_CROSS_ENTROPY;
  while (pending_.size() > keep) {
    const Pending& p = pending_.front();
    k_->Synchronize(outputs_ready_[p.slot].get());
    StepOutcome out;
    out.index = p.index;
    out.tag = p.tag;
    out.staleness = p.staleness;
    CountOutputs(outputs_[p.slot], static_cast<int>(p.labels.size()), p.labels.data(), softmax,
                 &out);
    {
      absl::MutexLock lock(&mu_);
      outcomes_.push_back(out);
    }
    pending_.pop_front();
  }
}

absl::Status LocalStepPipeline::Drain() {
  PS_RETURN_IF_ERROR(RetrySync());
  CollectOutcomes(0);
  if (!have_params_) return absl::OkStatus();
  PS_RETURN_IF_ERROR(Merge(/*wait=*/true));
  int unsynced;
  {
    absl::MutexLock lock(&mu_);
    unsynced = since_sync_;
  }
  if (unsynced == 0) return absl::OkStatus();
  StartSync(last_tag_);
  return Merge(/*wait=*/true);
}

int LocalStepPipeline::pushes_in_flight() const {
  absl::MutexLock lock(&mu_);
  return (sync_ != Sync::kNone ? 1 : 0) + (since_sync_ > 0 ? 1 : 0);
}

void LocalStepPipeline::Invalidate() {
  CollectOutcomes(0);
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sync_ != Sync::kPushing; };
  mu_.Await(absl::Condition(&idle));
  sync_ = Sync::kNone;
  since_sync_ = 0;
  have_params_ = false;
}

std::vector<StepOutcome> LocalStepPipeline::TakeOutcomes() {
  absl::MutexLock lock(&mu_);
  std::vector<StepOutcome> out;
  out.swap(outcomes_);
  return out;
}

int LocalStepPipeline::max_staleness() const {
  absl::MutexLock lock(&mu_);
  return max_staleness_;
}

}  // namespace pscluster
