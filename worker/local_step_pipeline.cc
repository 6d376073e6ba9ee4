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
    std::vector<Model*> towers, TowerReducer* reducer, ParameterClient* client,
    const v1::ModelSpec& spec, int local_steps, int num_workers) {
  if (local_steps < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("local steps must be >= 2 (1: push every step), got ", local_steps));
  }
  if (towers.empty()) return absl::InvalidArgumentError("local steps need a tower");
  for (Model* m : towers) {
    if (m->dense_variables() != towers[0]->dense_variables() ||
        m->max_batch() != towers[0]->max_batch()) {
      return absl::InvalidArgumentError("the towers of a worker must hold the same model");
    }
  }
  if (towers.size() > 1 && reducer == nullptr) {
    return absl::InvalidArgumentError("towers need a TowerReducer");
  }
  if (!towers[0]->tables().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", towers[0]->config().name(),
                     " has embedding tables; local steps keep dense variables only on the worker"));
  }
  if (num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers must be >= 1, got ", num_workers));
  }
  auto p = std::unique_ptr<LocalStepPipeline>(
      new LocalStepPipeline(std::move(towers), reducer, client, local_steps, num_workers));
  PS_RETURN_IF_ERROR(p->Allocate(spec));
  p->comm_thread_ = std::thread([raw = p.get()] { raw->CommThread(); });
  return p;
}

LocalStepPipeline::LocalStepPipeline(std::vector<Model*> towers, TowerReducer* reducer,
                                     ParameterClient* client, int local_steps, int num_workers)
    : towers_(towers.size()),
      models_(towers),
      reducer_(reducer),
      client_(client),
      model_(towers[0]),
      k_(towers[0]->kernels()),
      local_steps_(local_steps),
      num_workers_(num_workers),
      delta_scale_(1.0f / static_cast<float>(num_workers)),
      n_(towers[0]->dense_total()),
      stage_(static_cast<int>(towers.size()) - 1) {
  for (size_t t = 0; t < towers.size(); ++t) {
    towers_[t].model = towers[t];
    towers_[t].k = towers[t]->kernels();
  }
}

LocalStepPipeline::~LocalStepPipeline() {
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sync_ != Sync::kPushing; };
    mu_.Await(absl::Condition(&idle));
    stopping_ = true;
  }
  if (comm_thread_.joinable()) comm_thread_.join();
  // The devices may still read or write the buffers. (A Create that failed part way made some
  // of the events, or none.)
  for (Tower& t : towers_) {
    auto synchronize = [&t](const std::unique_ptr<Kernels::Event>& e) {
      if (e != nullptr) t.k->Synchronize(e.get());
    };
    for (const auto& e : t.outputs_ready) synchronize(e);
    synchronize(t.fresh_uploaded);
    synchronize(t.fresh_consumed);
    if (&t == &towers_[0]) synchronize(delta_downloaded_);
    for (Model::Outputs& o : t.outputs) {
      for (void* p : {static_cast<void*>(o.loss), static_cast<void*>(o.predictions),
                      static_cast<void*>(o.logits)}) {
        if (p != nullptr) t.k->FreeHost(p);
      }
    }
    for (void* p : t.owned) t.k->Free(p);
  }
  for (void* p : {static_cast<void*>(host_delta_), static_cast<void*>(host_fresh_)}) {
    if (p != nullptr) k_->FreeHost(p);
  }
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
  for (Tower& t : towers_) PS_RETURN_IF_ERROR(AllocateTower(&t));
  PS_ASSIGN_OR_RETURN(delta_, k_->AllocateFloats(std::max<int64_t>(n_, 1)));
  towers_[0].owned.push_back(delta_);
  PS_ASSIGN_OR_RETURN(void* delta, k_->AllocateHost(std::max<int64_t>(n_, 1) * 4));
  host_delta_ = static_cast<float*>(delta);
  PS_ASSIGN_OR_RETURN(void* fresh, k_->AllocateHost(std::max<int64_t>(n_, 1) * 4));
  host_fresh_ = static_cast<float*>(fresh);
  delta_downloaded_ = k_->NewEvent();
  return absl::OkStatus();
}

absl::Status LocalStepPipeline::AllocateTower(Tower* t) {
  Kernels* k = t->k;
  auto floats = [t, k](int64_t n) -> absl::StatusOr<float*> {
    PS_ASSIGN_OR_RETURN(float* p, k->AllocateFloats(std::max<int64_t>(n, 1)));
    t->owned.push_back(p);
    return p;
  };
  for (float** b : {&t->local, &t->base, &t->snap, &t->fresh}) {
    PS_ASSIGN_OR_RETURN(*b, floats(n_));
  }
  t->slot0.assign(groups_.size(), nullptr);
  t->slot1.assign(groups_.size(), nullptr);
  for (size_t i = 0; i < groups_.size(); ++i) {
    const UpdateGroup& g = groups_[i];
    // Every kind here starts its slots at 0.
    const int slots = g.optimizer->num_slots();
    if (slots >= 1) {
      PS_ASSIGN_OR_RETURN(t->slot0[i], floats(g.size));
      k->Fill(t->slot0[i], g.size, 0.0f);
    }
    if (slots >= 2) {
      PS_ASSIGN_OR_RETURN(t->slot1[i], floats(g.size));
      k->Fill(t->slot1[i], g.size, 0.0f);
    }
  }
  t->fresh_uploaded = k->NewEvent();
  t->fresh_consumed = k->NewEvent();
  const int64_t b = t->model->max_batch();
  for (int s = 0; s < kOutputSlots; ++s) {
    PS_ASSIGN_OR_RETURN(void* loss, k->AllocateHost(b * 4));
    PS_ASSIGN_OR_RETURN(void* pred, k->AllocateHost(b * 4));
    PS_ASSIGN_OR_RETURN(void* logits, k->AllocateHost(b * 4));
    t->outputs[s].loss = static_cast<float*>(loss);
    t->outputs[s].predictions = static_cast<int32_t*>(pred);
    t->outputs[s].logits = static_cast<float*>(logits);
    t->outputs_ready[s] = k->NewEvent();
    t->outputs[s].ready = t->outputs_ready[s].get();
  }
  return absl::OkStatus();
}

absl::Status LocalStepPipeline::Stage(int64_t index, const PreparedBatch& batch) {
  return StageOverTowers(models_, static_cast<int>(index % Model::kInputSlots), batch);
}

absl::Status LocalStepPipeline::StageGathered(int64_t index, const Dataset& data,
                                              const std::vector<int64_t>& positions) {
  return StageGatheredOverTowers(models_, index, data, positions, &stage_);
}

absl::Status LocalStepPipeline::PullFresh() {
  std::vector<std::vector<float>> values;
  PS_RETURN_IF_ERROR(client_->Pull(model_->dense_variables(), &values));
  // The previous uploads from host_fresh_ must be done before it is written.
  for (Tower& t : towers_) t.k->Synchronize(t.fresh_uploaded.get());
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
  // Every tower's snapshot (they are equal); delta = (local - base) / workers from tower 0,
  // taken now; the local copies go on changing meanwhile.
  for (Tower& t : towers_) t.k->ScaleCopy(n_, 1.0f, t.local, t.snap);
  const Tower& t0 = towers_[0];
  k_->ScaleCopy(n_, 1.0f, t0.local, delta_);
  k_->Axpy(n_, -1.0f, t0.base, delta_);
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

void LocalStepPipeline::UploadFresh(Tower& t, float* device) {
  // The last fold-in must have read t.fresh (or base) before it is written again; the compute
  // stream then waits for the copy.
  t.k->Wait(kUpload, t.fresh_consumed.get());
  t.k->CopyToDeviceAsync(kUpload, host_fresh_, device, n_ * 4);
  t.k->Record(t.fresh_uploaded.get(), kUpload);
  t.k->Wait(kCompute, t.fresh_uploaded.get());
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
  // host_fresh_: the ps's values with the delta in. On every tower, local = fresh + (local -
  // snapshot), base = fresh.
  for (Tower& t : towers_) {
    UploadFresh(t, t.fresh);
    t.k->ScaleCopy(n_, 1.0f, t.fresh, t.base);
    t.k->Axpy(n_, -1.0f, t.snap, t.fresh);
    t.k->Axpy(n_, 1.0f, t.fresh, t.local);
    t.k->Record(t.fresh_consumed.get(), kCompute);
  }
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
  // The ps's decay counts every worker's updates; the granted step counts this worker's.
  const int64_t decay_t = std::max<int64_t>(tag, 0) * num_workers_ + 1;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const UpdateGroup& g = groups_[i];
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
    for (Tower& t : towers_) {
      t.k->ApplyUpdate(u, g.size, t.model->device_grads() + g.offset, t.local + g.offset,
                       t.slot0[i], t.slot1[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status LocalStepPipeline::Run(int64_t index, int64_t tag, int64_t /*pull_step*/,
                                    const PreparedBatch& batch) {
  PS_RETURN_IF_ERROR(RetrySync());
  if (!have_params_) {
    PS_RETURN_IF_ERROR(PullFresh());
    for (Tower& t : towers_) {
      UploadFresh(t, t.base);
      t.k->ScaleCopy(n_, 1.0f, t.base, t.local);
    }
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
  const int in_slot = static_cast<int>(index % Model::kInputSlots);
  // The outputs of the step that used this slot must be on the host first.
  CollectOutcomes(kOutputSlots - 1);
  Pending p;
  int whole = 0;
  for (const Tower& t : towers_) {
    p.tower_sizes.push_back(t.model->staged_size(in_slot));
    whole += p.tower_sizes.back();
  }
  for (size_t i = 0; i < towers_.size(); ++i) {
    Tower& t = towers_[i];
    std::vector<const float*> params;
    for (int64_t offset : t.model->dense_offsets()) params.push_back(t.local + offset);
    // Each tower's gradient is scaled by its share of the batch, so their sum is the gradient
    // of the whole batch.
    const float scale = towers_.size() == 1 ? 1.0f
                                            : static_cast<float>(p.tower_sizes[i]) /
                                                  static_cast<float>(std::max(whole, 1));
    PS_RETURN_IF_ERROR(t.model->Enqueue(in_slot, params, {}, Model::Pass::kTraining, scale,
                                        Model::Hooks(), t.outputs[slot]));
  }
  if (towers_.size() > 1) {
    std::vector<float*> grads;
    for (Tower& t : towers_) grads.push_back(t.model->device_grads());
    PS_RETURN_IF_ERROR(reducer_->AllReduceSum(grads, n_));
  }
  PS_RETURN_IF_ERROR(ApplyLocalUpdate(tag));
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
    StepOutcome out;
    out.index = p.index;
    out.tag = p.tag;
    out.staleness = p.staleness;
    for (size_t i = 0; i < towers_.size(); ++i) {
      const Tower& t = towers_[i];
      t.k->Synchronize(t.outputs_ready[p.slot].get());
      CountOutputs(t.outputs[p.slot], p.tower_sizes[i], p.labels.data() + out.examples, softmax,
                   &out);
    }
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
