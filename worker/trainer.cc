#include "worker/trainer.h"

#include <chrono>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/data/shard.h"

namespace pscluster {
namespace {

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
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

}  // namespace

Trainer::Trainer(const v1::GetModelResponse& model, Dataset train, ParameterClient* client,
                 Kernels* kernels, v1::Coordinator::StubInterface* chief,
                 const TrainerOptions& options)
    : model_(model),
      train_(std::move(train)),
      client_(client),
      kernels_(kernels),
      chief_(chief),
      options_(options) {}

absl::Status Trainer::Report(int64_t step, int64_t examples, double loss_sum,
                             int64_t steps_in_report, bool finished) {
  v1::ReportStepRequest req;
  req.set_worker(options_.worker);
  req.set_step(step);
  req.set_examples(examples);
  req.set_loss(steps_in_report > 0 ? static_cast<float>(loss_sum / steps_in_report) : 0.0f);
  req.set_epoch(epoch_.load());
  req.set_finished(finished);
  req.set_generation(generation_);
  v1::ReportStepResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.rpc_timeout);
  return FromGrpcStatus(chief_->ReportStep(&ctx, req, &resp));
}

absl::Status Trainer::ReportWithRetries(int64_t step, int64_t examples, double loss_sum,
                                        int64_t steps_in_report, bool finished,
                                        const std::function<bool()>& stop) {
  // The chief may be restarting: UNAVAILABLE is retried, as a failed step is.
  absl::Status reported;
  for (int attempt = 0; attempt <= options_.max_step_retries && !stop(); ++attempt) {
    reported = Report(step, examples, loss_sum, steps_in_report, finished);
    if (reported.ok() || reported.code() != absl::StatusCode::kUnavailable) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return reported;
}

absl::Status Trainer::AcquireToken(int64_t last_done_step, v1::AcquireTokenResponse* resp,
                                  const std::function<bool()>& stop) {
  // Long-poll: each wait has a deadline, and a stop request ends it.
  while (true) {
    v1::AcquireTokenRequest req;
    req.set_worker(options_.worker);
    req.set_step(last_done_step);
    req.set_generation(generation_);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(1));
    absl::Status s = FromGrpcStatus(chief_->AcquireToken(&ctx, req, resp));
    if (s.ok() || s.code() != absl::StatusCode::kDeadlineExceeded) return s;
    if (stop()) return absl::OkStatus();
  }
}

absl::Status Trainer::ComputeAndPush(int64_t step, Model& model, const PreparedBatch& current,
                                     std::vector<std::vector<float>>* params,
                                     std::vector<std::vector<float>>* rows, StepResult* result) {
  const std::vector<std::string>& variables = model.dense_variables();
  // SYNC: the values from before step `step` (see PullDenseRequest.step); others: the newest.
  const int64_t pull_step = model_.sync().mode() == v1::SYNC ? step : -1;
  PS_RETURN_IF_ERROR(client_->Pull(variables, params, pull_step));
  const Batch batch = AsBatch(current.data);
  for (size_t t = 0; t < model.tables().size(); ++t) {
    (*rows)[t].resize(current.sparse.unique_ids.size() * model.table_dims()[t]);
    PS_RETURN_IF_ERROR(client_->PullRows(model.tables()[t], current.sparse.unique_ids.data(),
                                         current.sparse.unique_ids.size(), (*rows)[t].data(),
                                         pull_step));
  }
  std::vector<const float*> param_ptrs, row_ptrs;
  for (const auto& p : *params) param_ptrs.push_back(p.data());
  for (const auto& r : *rows) row_ptrs.push_back(r.data());
  PS_RETURN_IF_ERROR(model.Compute(batch, current.sparse, param_ptrs, row_ptrs,
                                   /*backward=*/true, result));
  // A straggler, for tests: in sync mode its gradients arrive after the step closed.
  if (options_.step_delay > absl::ZeroDuration()) absl::SleepFor(options_.step_delay);
  std::vector<const float*> grads;
  for (const auto& g : result->dense_grads) grads.push_back(g.data());
  PS_RETURN_IF_ERROR(client_->Push(variables, grads, step));
  for (size_t t = 0; t < model.tables().size(); ++t) {
    PS_RETURN_IF_ERROR(client_->PushRows(model.tables()[t], current.sparse.unique_ids.data(),
                                         current.sparse.unique_ids.size(),
                                         result->row_grads[t].data(), step));
  }
  return absl::OkStatus();
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
  absl::SleepFor(absl::Milliseconds(200));
  return true;
}

absl::Status Trainer::RunSync(Model& model, int batch_size, const std::function<bool()>& stop) {
  const v1::TrainingOptions& training = model_.training();
  BatchIterator batches(&train_, batch_size, training.shuffle_seed());
  const int64_t per_epoch = batches.batches_per_epoch();
  if (per_epoch == 0) return absl::FailedPreconditionError("this worker's shard of the data is empty");
  const int epochs = std::max(1, training.epochs());
  int64_t end = epochs * per_epoch;
  if (training.max_steps() > 0) end = std::min(end, training.max_steps());
  // The batch of global step s is batch s % per_epoch of epoch s / per_epoch, whatever happened
  // before: a step computed again after a recovery uses the batch it used the first time.
  auto prepare = [&batches, per_epoch](int64_t step) {
    PreparedBatch p;
    const int64_t epoch = step / per_epoch, index = step % per_epoch;
    if (batches.epoch() != epoch || batches.next_batch() != index) batches.Seek(epoch, index);
    p.valid = batches.Next(&p.data);
    if (p.valid) Model::PrepareSparse(AsBatch(p.data), &p.sparse);
    return p;
  };
  PreparedBatch current;
  int64_t current_step = -1;
  std::future<PreparedBatch> next;  // the batch of current_step + 1, assembled meanwhile
  int64_t last_done = -1;
  int failures = 0;
  absl::Time last_log = absl::Now();
  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> rows(model.tables().size());
  StepResult result;
  while (!stop()) {
    v1::AcquireTokenResponse token;
    absl::Status s = AcquireToken(last_done, &token, stop);
    if (stop()) break;
    int64_t step = -1;
    if (s.ok()) {
      if (token.finished() || token.step() >= end) break;
      step = token.step();
      if (token.generation() != generation_) {
        // A recovery sent the global step back (or the chief restarted): what this worker did
        // since belongs to abandoned steps, and its position is now just before its token.
        if (step <= last_done) {
          LOG(WARNING) << "worker:" << options_.worker
                       << " the chief sent the global step back from " << last_done + 1 << " to "
                       << step << " (a recovery restored a checkpoint); computing again from there";
        }
        generation_ = token.generation();
        last_done = step - 1;
      }
      if (step != current_step) {
        if (next.valid() && current_step + 1 == step) {
          current = next.get();
        } else {
          if (next.valid()) next.wait();
          current = prepare(step);
        }
        current_step = step;
        next = step + 1 < end ? std::async(std::launch::async, prepare, step + 1)
                              : std::future<PreparedBatch>();
      }
      s = ComputeAndPush(step, model, current, &params, &rows, &result);
    }
    if (!s.ok()) {
      // The chief or a ps task is briefly gone (restarting, being restored): ask for the token
      // again, which may name another step after a recovery.
      if (RetryStep(s, &failures)) continue;
      return s;
    }
    failures = 0;
    last_done = step;
    steps_.fetch_add(1);
    epoch_ = static_cast<int32_t>(step / per_epoch);
    if (options_.step_counter != nullptr) options_.step_counter->store(steps_.load());
    if (absl::Now() - last_log >= options_.report_every) {
      LOG(INFO) << absl::StrFormat("worker:%d global step %d epoch %d/%d loss %.4f",
                                   options_.worker, step, epoch_.load() + 1, epochs, result.loss);
      last_log = absl::Now();
    }
    PS_RETURN_IF_ERROR(ReportWithRetries(step + 1, current.data.num_examples, result.loss, 1,
                                         /*finished=*/false, stop));
  }
  if (next.valid()) next.wait();
  if (stop()) return absl::OkStatus();
  LOG(INFO) << "worker:" << options_.worker << " finished training after " << steps_.load()
            << " steps (global step " << last_done + 1 << ")";
  return ReportWithRetries(last_done + 1, 0, 0, 0, /*finished=*/true, stop);
}

absl::Status Trainer::Run(const std::function<bool()>& stop) {
  const v1::TrainingOptions& training = model_.training();
  const int batch_size = training.batch_size() > 0 ? training.batch_size() : 128;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      Model::Create(model_.config(), kernels_, batch_size));
  if (model_.sync().mode() == v1::SYNC) return RunSync(*model, batch_size, stop);
  // ASYNC and SSP: each worker walks its own epochs and asks for a token before each step (SSP:
  // to stay within the staleness bound, reporting every step; ASYNC: answered at once, unless
  // the chief holds the workers for a checkpoint or a recovery).
  const bool ssp = model_.sync().mode() == v1::SSP;
  BatchIterator batches(&train_, batch_size, training.shuffle_seed());

  int64_t report_examples = 0, report_steps = 0;
  double report_loss = 0;
  absl::Time last_report = absl::Now();
  int64_t last_done_step = -1;
  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> rows(model->tables().size());
  StepResult result;
  const int epochs = std::max(1, training.epochs());
  for (int epoch = 0; epoch < epochs && !stop(); ++epoch) {
    epoch_ = epoch;
    batches.StartEpoch(epoch);
    auto prepare = [&batches]() {
      PreparedBatch p;
      p.valid = batches.Next(&p.data);
      if (p.valid) Model::PrepareSparse(AsBatch(p.data), &p.sparse);
      return p;
    };
    std::future<PreparedBatch> next = std::async(std::launch::async, prepare);
    while (!stop()) {
      PreparedBatch current = next.get();
      if (!current.valid) break;
      next = std::async(std::launch::async, prepare);  // the next batch, while this one computes

      // A step that fails because a ps task or the chief is briefly gone (restarting, being
      // restored) is tried again with the same batch, so the data position is kept.
      int64_t step = steps_.load();
      int failures = 0;
      bool over = false;
      while (!stop()) {
        v1::AcquireTokenResponse token;
        absl::Status s = AcquireToken(last_done_step, &token, stop);
        if (s.ok() && token.finished()) over = true;
        if (s.ok() && ssp) step = token.step();
        if (stop() || over) break;
        if (s.ok()) s = ComputeAndPush(step, *model, current, &params, &rows, &result);
        if (s.ok()) break;
        if (!RetryStep(s, &failures)) return s;
      }
      if (stop()) return absl::OkStatus();
      if (over) break;  // the chief says training is over
      const Batch batch = AsBatch(current.data);
      last_done_step = step;
      steps_.fetch_add(1);
      if (options_.step_counter != nullptr) options_.step_counter->store(steps_.load());
      report_examples += batch.size;
      report_loss += result.loss;
      ++report_steps;
      if (ssp || absl::Now() - last_report >= options_.report_every) {
        if (absl::Now() - last_report >= options_.report_every) {
          LOG(INFO) << absl::StrFormat("worker:%d step %d epoch %d/%d loss %.4f",
                                       options_.worker, steps_.load(), epoch + 1, epochs,
                                       report_loss / report_steps);
        }
        PS_RETURN_IF_ERROR(ReportWithRetries(last_done_step + 1, report_examples, report_loss,
                                             report_steps, /*finished=*/false, stop));
        report_examples = report_steps = 0;
        report_loss = 0;
        last_report = absl::Now();
      }
      if (training.max_steps() > 0 && steps_.load() >= training.max_steps()) break;
    }
    if (next.valid()) next.wait();
    if (training.max_steps() > 0 && steps_.load() >= training.max_steps()) break;
  }
  if (stop()) return absl::OkStatus();
  LOG(INFO) << "worker:" << options_.worker << " finished training after " << steps_.load()
            << " steps";
  return ReportWithRetries(last_done_step + 1, report_examples, report_loss, report_steps,
                           /*finished=*/true, stop);
}

}  // namespace pscluster
