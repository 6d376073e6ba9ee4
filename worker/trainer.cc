#include "worker/trainer.h"

#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "glog/logging.h"
#include "model/data/shard.h"
#include "model/model.h"
#include "worker/local_step_pipeline.h"
#include "worker/step_pipeline.h"
#include "worker/step_policy.h"

namespace pscluster {
namespace {

// The batches of the loop: the one a step asks for, with the following one assembled (and, for a
// model without tables, gathered straight into the pipeline's staging area for the next step)
// on another thread meanwhile, since a step usually asks for the batch after the last one.
// Thread-compatible.
class BatchFeeder {
 public:
  BatchFeeder(const Dataset* data, int batch_size, uint64_t seed, bool drop_remainder,
              StepRunner* pipeline)
      : data_(data),
        batch_size_(batch_size),
        batches_(data, batch_size, seed, drop_remainder),
        pipeline_(pipeline),
        thread_(1) {}
  ~BatchFeeder() {
    if (next_.valid()) next_.wait();
  }

  int64_t per_epoch() const { return batches_.batches_per_epoch(); }

  // Batch `index` of epoch `epoch`, staged for the pipeline's step `step`; valid until the next
  // call. Errors of the staging (a bad label, say).
  absl::StatusOr<const PreparedBatch*> Get(int64_t epoch, int64_t index, int64_t step) {
    if (next_.valid() && next_epoch_ == epoch && next_index_ == index && next_step_ == step) {
      current_ = next_.get();
    } else {
      if (next_.valid()) next_.wait();
      current_ = Prepare(epoch, index, step);
    }
    if (current_.batch.valid && !current_.staged) {
      current_.status = pipeline_->Stage(step, current_.batch);
      current_.staged = current_.status.ok();
    }
    // The following batch, in the background.
    next_epoch_ = index + 1 < per_epoch() ? epoch : epoch + 1;
    next_index_ = index + 1 < per_epoch() ? index + 1 : 0;
    next_step_ = step + 1;
    auto promise = std::make_shared<std::promise<Prepared>>();
    next_ = promise->get_future();
    const int64_t e = next_epoch_, i = next_index_, st = next_step_;
    thread_.Schedule([this, promise, e, i, st] { promise->set_value(Prepare(e, i, st)); });
    if (!current_.status.ok()) return current_.status;
    return &current_.batch;
  }

 private:
  struct Prepared {
    PreparedBatch batch;
    bool staged = false;
    absl::Status status;
  };

  Prepared Prepare(int64_t epoch, int64_t index, int64_t step) {
    Prepared p;
    if (!pipeline_->can_gather()) {
      // Tables: the whole batch and its sparse ids; staged by the training thread.
      if (batches_.epoch() != epoch || batches_.next_batch() != index) {
        batches_.Seek(epoch, index);
      }
      p.batch.valid = batches_.Next(&p.batch.data);
      if (p.batch.valid) Model::PrepareSparse(AsBatch(p.batch.data), &p.batch.sparse);
      return p;
    }
    if (batches_.epoch() != epoch) batches_.StartEpoch(epoch);
    const std::vector<int64_t>& order = batches_.epoch_order();
    const int64_t begin = index * batch_size_;
    const int64_t end = std::min<int64_t>(begin + batch_size_, static_cast<int64_t>(order.size()));
    if (index < 0 || index >= per_epoch() || begin >= end) return p;
    positions_.assign(order.begin() + begin, order.begin() + end);
    p.batch.valid = true;
    p.batch.data.num_examples = end - begin;
    p.batch.data.dense_dim = data_->dense_dim;
    p.batch.data.num_classes = data_->num_classes;
    p.batch.data.labels.resize(positions_.size());
    for (size_t i = 0; i < positions_.size(); ++i) {
      p.batch.data.labels[i] = data_->labels[positions_[i]];
    }
    p.status = pipeline_->StageGathered(step, *data_, positions_);
    p.staged = p.status.ok();
    return p;
  }

  const Dataset* const data_;  // Not owned.
  const int batch_size_;
  BatchIterator batches_;       // used by one Prepare at a time
  StepRunner* const pipeline_;  // Not owned.
  std::vector<int64_t> positions_;
  ThreadPool thread_;
  std::future<Prepared> next_;
  int64_t next_epoch_ = -1, next_index_ = -1, next_step_ = -1;
  Prepared current_;
};

}  // namespace

Trainer::Trainer(const v1::GetModelResponse& model, Dataset train, ParameterClient* client,
                 std::vector<Kernels*> towers, StepSource* source, const TrainerOptions& options)
    : model_(model),
      train_(std::move(train)),
      client_(client),
      towers_(std::move(towers)),
      source_(source),
      options_(options) {}

absl::Status Trainer::ReportWithRetries(const StepReport& report,
                                        const std::function<bool()>& stop) {
  // The chief may be restarting: UNAVAILABLE is retried, as a failed step is.
  absl::Status reported;
  for (int attempt = 0; attempt <= options_.max_step_retries && !stop(); ++attempt) {
    reported = source_->Report(report);
    if (reported.ok() || reported.code() != absl::StatusCode::kUnavailable) break;
    if (attempt == 0) {
      // (A chief killed as it took the report may have counted it; a new chief has not.)
      LOG(WARNING) << "worker:" << options_.worker << ": the chief did not take the report of step "
                   << report.step << (report.finished ? " (finished)" : "") << " (" << reported
                   << "); sending it again";
    }
    options_.clock->SleepFor(absl::Milliseconds(200));
  }
  return reported;
}

bool Trainer::RetryStep(const absl::Status& status, int* failures) const {
  const absl::StatusCode code = status.code();
  if ((code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kNotFound &&
       code != absl::StatusCode::kDeadlineExceeded) ||
      ++*failures > options_.max_step_retries) {
    return false;
  }
  LOG(WARNING) << "worker:" << options_.worker << " step failed (" << status
               << "); trying it again";
  options_.clock->SleepFor(absl::Milliseconds(200));
  if (options_.before_retry) options_.before_retry();
  return true;
}

absl::Status Trainer::Run(const std::function<bool()>& stop) {
  const v1::TrainingOptions& training = model_.training();
  const int batch_size = training.batch_size() > 0 ? training.batch_size() : 128;
  const int num_towers = static_cast<int>(towers_.size());
  if (num_towers < 1) return absl::InvalidArgumentError("a trainer needs a device");
  if (batch_size < num_towers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a batch of ", batch_size, " examples cannot be split over ", num_towers, " devices"));
  }
  // Each tower takes its share of the batch.
  const int per_tower = (batch_size + num_towers - 1) / num_towers;
  std::vector<std::unique_ptr<Model>> models;
  std::vector<Model*> tower_models;
  for (Kernels* k : towers_) {
    // A GPU has the memory to keep each convolution's patches for its backward pass.
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Model> m,
                        Model::Create(model_.config(), k, per_tower,
                                      /*keep_patches=*/!k->device_is_host()));
    tower_models.push_back(m.get());
    models.push_back(std::move(m));
  }
  // A model without tables or augmentation trains on a copy of this worker's shard kept on
  // each device: a step uploads only its batch's positions. Otherwise (SetResidentData says
  // which), without room, or with a label the first bad batch will name, batches are gathered
  // on the host.
  for (Model* m : tower_models) {
    m->set_capture(options_.cuda_graphs);
    const absl::Status resident =
        m->SetResidentData(train_.dense.data(), train_.labels.data(), train_.num_examples);
    if (resident.code() == absl::StatusCode::kResourceExhausted) {
      LOG(WARNING) << "worker:" << options_.worker << " keeps its data on the host (" << resident
                   << ")";
    }
  }
  std::unique_ptr<TowerReducer> reducer;
  if (num_towers > 1) {
    PS_ASSIGN_OR_RETURN(reducer, NewTowerReducer(towers_));
  }
  // Towers split every batch: an epoch's last, short batch is dropped rather than split
  // below one example per tower.
  const bool drop_remainder = num_towers > 1;
  const int64_t per_epoch =
      BatchIterator(&train_, batch_size, training.shuffle_seed(), drop_remainder)
          .batches_per_epoch();
  if (per_epoch == 0) {
    return absl::FailedPreconditionError("this worker's shard of the data is empty");
  }
  const int epochs = std::max(1, training.epochs());
  std::unique_ptr<StepPolicy> policy =
      NewStepPolicy(model_.sync().mode(), per_epoch, epochs, training.max_steps());
  StepPipelineOptions pipeline_options;
  pipeline_options.staleness = policy->allows_overlap() ? options_.staleness : 0;
  pipeline_options.comm_threads = options_.comm_threads;
  pipeline_options.push_delay = options_.step_delay;
  pipeline_options.clock = options_.clock;
  const int local_steps = model_.sync().local_steps();
  std::unique_ptr<StepRunner> pipeline;
  if (local_steps > 1) {
    if (model_.sync().mode() == v1::SYNC) {
      return absl::InvalidArgumentError("local steps need async or ssp mode, not sync");
    }
    PS_ASSIGN_OR_RETURN(
        pipeline, LocalStepPipeline::Create(tower_models, reducer.get(), client_, model_.model(),
                                            local_steps, options_.num_workers));
    pipeline_options.staleness = local_steps;
  } else {
    PS_ASSIGN_OR_RETURN(
        pipeline, StepPipeline::Create(tower_models, reducer.get(), client_, pipeline_options));
  }
  BatchFeeder feeder(&train_, batch_size, training.shuffle_seed(), drop_remainder, pipeline.get());
  LOG(INFO) << "worker:" << options_.worker << " trains on " << num_towers << " device(s) ("
            << towers_[0]->name() << (num_towers > 1 ? ", ..." : "") << "), batch " << batch_size
            << (local_steps > 1
                    ? absl::StrCat(", ", local_steps, " local steps per push")
                    : absl::StrCat(", pipeline staleness ", pipeline_options.staleness));

  // Progress since the last report.
  StepReport pending;
  double loss_sum = 0;
  double staleness_sum = 0;
  int64_t outcome_steps = 0;
  auto collect = [&] {
    for (const StepOutcome& o : pipeline->TakeOutcomes()) {
      pending.examples += o.examples;
      loss_sum += o.loss_sum;
      staleness_sum += o.staleness;
      pending.max_staleness = std::max(pending.max_staleness, o.staleness);
      ++outcome_steps;
    }
  };
  auto report = [&](bool finished) {
    collect();
    pending.step = policy->steps_done();
    pending.epoch = epoch_.load();
    pending.finished = finished;
    pending.generation = policy->generation();
    pending.loss = pending.examples > 0 ? static_cast<float>(loss_sum / pending.examples) : 0.0f;
    pending.mean_staleness =
        outcome_steps > 0 ? static_cast<float>(staleness_sum / outcome_steps) : 0.0f;
    absl::Status s = ReportWithRetries(pending, stop);
    pending = StepReport();
    loss_sum = staleness_sum = 0;
    outcome_steps = 0;
    return s;
  };

  // ASYNC with overlapping steps: the gate's pass for the next step is asked for while this one
  // runs (the step about to run counts as a push in flight, so a closing gate answers "drain"
  // and no cut falls inside it), which takes the chief's answer off the step's critical path.
  const bool prefetch_gate = model_.sync().mode() == v1::ASYNC && pipeline_options.staleness > 0;
  // ASYNC with local steps: only the step that starts a delta's push touches the ps, so the gate
  // is asked once per K steps (a checkpoint's cut waits up to K local steps); the steps between
  // are granted here, as the chief grants them (last done + 1).
  const int gate_every = model_.sync().mode() == v1::ASYNC && local_steps > 1 ? local_steps : 1;
  ThreadPool gate_thread(prefetch_gate ? 1 : 0);
  using GateAnswer = std::pair<absl::Status, StepGrant>;
  std::future<GateAnswer> next_gate;
  auto ask_gate = [this, &stop](int64_t last_done, int in_flight) {
    GateAnswer a;
    a.first = source_->Acquire(last_done, 0, in_flight, stop, &a.second);
    return a;
  };

  int64_t index = 0;  // the pipeline's step sequence
  int failures = 0;
  // The first step is reported at once (the chief's training clock, and so time to accuracy,
  // starts at the first report), then every report_every; progress is logged every 2 s.
  absl::Time last_report = absl::InfinitePast();
  absl::Time last_log = absl::InfinitePast();
  while (!stop()) {
    StepGrant grant;
    absl::Status s;
    if (index % gate_every != 0 && failures == 0) {
      grant.step = policy->last_done() + 1;
    } else if (next_gate.valid()) {
      GateAnswer a = next_gate.get();
      s = a.first;
      grant = a.second;
    } else {
      s = source_->Acquire(policy->last_done(), policy->generation(), pipeline->pushes_in_flight(),
                           stop, &grant);
    }
    if (stop()) break;
    StepPlan plan;
    if (s.ok() && grant.drain) {
      // A checkpoint or a recovery waits for this worker's pushes.
      s = pipeline->Drain();
      if (s.ok()) continue;
    }
    if (s.ok()) {
      const int64_t last_done = policy->last_done();
      plan = policy->Plan(grant);
      if (plan.end) break;
      if (plan.new_generation) {
        if (plan.tag <= last_done) {
          LOG(WARNING) << "worker:" << options_.worker << " the chief sent the global step back to "
                       << plan.tag
                       << " (a recovery restored a checkpoint); computing again from "
                          "there";
        }
        pipeline->Invalidate();
      }
      if (prefetch_gate && !grant.finished && (index + 1) % gate_every == 0) {
        auto promise = std::make_shared<std::promise<GateAnswer>>();
        next_gate = promise->get_future();
        const int64_t last_done = policy->last_done();
        const int in_flight = pipeline->pushes_in_flight() + 1;
        gate_thread.Schedule([promise, ask_gate, last_done, in_flight] {
          promise->set_value(ask_gate(last_done, in_flight));
        });
      }
      absl::StatusOr<const PreparedBatch*> batch = feeder.Get(plan.epoch, plan.batch, index);
      s = batch.status();
      if (s.ok() && !(*batch)->valid) {
        return absl::InternalError(absl::StrCat("no batch ", plan.batch, " in epoch ", plan.epoch));
      }
      if (s.ok()) s = pipeline->Run(index, plan.tag, plan.pull_step, **batch);
    }
    if (!s.ok()) {
      // The chief or a ps task is briefly gone (restarting, being restored): ask for the step
      // again, which may name another one after a recovery; the pipeline keeps what it could
      // not push and sends it first.
      if (RetryStep(s, &failures)) continue;
      return s;
    }
    failures = 0;
    policy->Done(plan);
    ++index;
    steps_.fetch_add(1);
    epoch_ = static_cast<int32_t>(plan.epoch);
    max_staleness_ = pipeline->max_staleness();
    if (options_.step_counter != nullptr) options_.step_counter->store(steps_.load());
    const absl::Time now = options_.clock->Now();
    const bool due = now - last_report >= options_.report_every;
    if (now - last_log >= absl::Seconds(2)) {
      last_log = now;
      collect();
      LOG(INFO) << absl::StrFormat("worker:%d step %d epoch %d/%d loss %.4f (staleness max %d)",
                                   options_.worker, plan.tag, plan.epoch + 1, epochs,
                                   pending.examples > 0 ? loss_sum / pending.examples : 0.0,
                                   pipeline->max_staleness());
    }
    if (policy->report_every_step() || due) {
      PS_RETURN_IF_ERROR(report(/*finished=*/false));
      last_report = options_.clock->Now();
    }
  }
  // A pass asked for ahead is answered (at once: it says the worker is still pushing).
  if (next_gate.valid()) next_gate.wait();
  // The last pushes, then the last report.
  absl::Status drained = pipeline->Drain();
  for (int attempts = 0; !drained.ok() && !stop() && RetryStep(drained, &attempts);) {
    drained = pipeline->Drain();
  }
  if (stop()) return absl::OkStatus();
  PS_RETURN_IF_ERROR(drained);
  LOG(INFO) << "worker:" << options_.worker << " finished training after " << steps_.load()
            << " steps (next step " << policy->steps_done() << ")";
  const int64_t final_step = policy->steps_done();
  PS_RETURN_IF_ERROR(report(/*finished=*/true));
  finished_step_ = final_step;
  return absl::OkStatus();
}

}  // namespace pscluster
