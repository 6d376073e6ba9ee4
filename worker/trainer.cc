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

absl::Status Trainer::RunStep(bool sync, int64_t last_done_step, Model& model,
                              const PreparedBatch& current,
                              std::vector<std::vector<float>>* params,
                              std::vector<std::vector<float>>* rows, StepResult* result,
                              int64_t* step, const std::function<bool()>& stop) {
  *step = steps_.load();
  if (sync) {
    // Long-poll for the token of the next step; each wait has a deadline, and a stop request
    // ends it.
    v1::AcquireTokenResponse resp;
    while (true) {
      v1::AcquireTokenRequest req;
      req.set_worker(options_.worker);
      req.set_step(last_done_step);
      grpc::ClientContext ctx;
      SetDeadline(&ctx, absl::Seconds(1));
      absl::Status s = FromGrpcStatus(chief_->AcquireToken(&ctx, req, &resp));
      if (s.ok()) break;
      if (s.code() != absl::StatusCode::kDeadlineExceeded) return s;
      if (stop()) return absl::OkStatus();
    }
    if (resp.finished()) {
      *step = -1;
      return absl::OkStatus();
    }
    *step = resp.step();
  }
  const std::vector<std::string>& variables = model.dense_variables();
  PS_RETURN_IF_ERROR(client_->Pull(variables, params));
  const Batch batch = AsBatch(current.data);
  for (size_t t = 0; t < model.tables().size(); ++t) {
    (*rows)[t].resize(current.sparse.unique_ids.size() * model.table_dims()[t]);
    PS_RETURN_IF_ERROR(client_->PullRows(model.tables()[t], current.sparse.unique_ids.data(),
                                         current.sparse.unique_ids.size(), (*rows)[t].data()));
  }
  std::vector<const float*> param_ptrs, row_ptrs;
  for (const auto& p : *params) param_ptrs.push_back(p.data());
  for (const auto& r : *rows) row_ptrs.push_back(r.data());
  PS_RETURN_IF_ERROR(model.Compute(batch, current.sparse, param_ptrs, row_ptrs,
                                   /*backward=*/true, result));
  std::vector<const float*> grads;
  for (const auto& g : result->dense_grads) grads.push_back(g.data());
  PS_RETURN_IF_ERROR(client_->Push(variables, grads, *step));
  for (size_t t = 0; t < model.tables().size(); ++t) {
    PS_RETURN_IF_ERROR(client_->PushRows(model.tables()[t], current.sparse.unique_ids.data(),
                                         current.sparse.unique_ids.size(),
                                         result->row_grads[t].data(), *step));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Run(const std::function<bool()>& stop) {
  const v1::TrainingOptions& training = model_.training();
  const int batch_size = training.batch_size() > 0 ? training.batch_size() : 128;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                      Model::Create(model_.config(), kernels_, batch_size));
  // SYNC and SSP both wait for a token before each step and report every step.
  const bool sync = model_.sync().mode() != v1::ASYNC;
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
      int64_t step = 0;
      absl::Status step_status;
      for (int attempt = 0;; ++attempt) {
        step_status = RunStep(sync, last_done_step, *model, current, &params, &rows, &result,
                              &step, stop);
        if (step_status.ok() || stop()) break;
        const absl::StatusCode code = step_status.code();
        if ((code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kNotFound &&
             code != absl::StatusCode::kDeadlineExceeded) ||
            attempt >= options_.max_step_retries) {
          return step_status;
        }
        LOG(WARNING) << "worker:" << options_.worker << " step failed (" << step_status
                     << "); trying it again";
        absl::SleepFor(absl::Milliseconds(200));
      }
      if (stop()) return absl::OkStatus();
      if (step < 0) break;  // the chief says training is over
      const Batch batch = AsBatch(current.data);
      last_done_step = step;
      steps_.fetch_add(1);
      if (options_.step_counter != nullptr) options_.step_counter->store(steps_.load());
      report_examples += batch.size;
      report_loss += result.loss;
      ++report_steps;
      if (sync || absl::Now() - last_report >= options_.report_every) {
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
      if (options_.step_delay > absl::ZeroDuration()) absl::SleepFor(options_.step_delay);
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
