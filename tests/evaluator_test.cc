// The evaluator task (TF_CONFIG's `evaluator`) through the real daemons: it evaluates the live
// model and ends training with the final evaluation, the chief computing nothing; the chief
// evaluates itself when the evaluator is gone; bad reports are refused and change nothing.
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

// Sync softmax regression on a slice of Fashion-MNIST: 3 epochs of 12,000 examples in batches
// of 50, 360 steps, a few seconds of training.
TestClusterOptions SoftmaxWithEvaluator(const std::string& metrics) {
  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = 2;
  options.num_evaluators = 1;
  options.flags["chief"] = {"--model_config=" + RunfilePath("configs/softmax_regression.pbtxt"),
                            "--mode=sync",
                            "--max_train_examples=12000",
                            "--max_test_examples=2000",
                            "--epochs=3",
                            "--batch_size=50",
                            "--eval_every_secs=1",
                            "--metrics_file=" + metrics};
  options.flags["evaluator"] = {"--eval_every_secs=1", "--exit_after_training"};
  return options;
}

v1::ClusterStatus AwaitFinished(v1::Coordinator::StubInterface& chief, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::ClusterStatus status;
  do {
    status = ClusterStatusOf(chief);
    if (status.progress().finished()) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  return status;
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The step and the training time of each evaluation in a metrics file, in order.
struct Evaluated {
  int64_t step;
  double training_seconds;
};
std::vector<Evaluated> EvaluationsIn(const std::vector<std::string>& lines) {
  std::vector<Evaluated> out;
  for (const std::string& line : lines) {
    const size_t step = line.find("\"step\": ");
    const size_t read = line.find("\"training_seconds\": ");
    if (step == std::string::npos || read == std::string::npos) {
      ADD_FAILURE() << "no step or training time in " << line;
      continue;
    }
    out.push_back({std::stoll(line.substr(step + 8)), std::stod(line.substr(read + 20))});
  }
  return out;
}

TEST(EvaluatorTest, TheEvaluatorEvaluatesTheLiveModelAndEndsTraining) {
  const std::string metrics = absl::StrCat(getenv("TEST_TMPDIR"), "/metrics-evaluator.jsonl");
  auto cluster = TestCluster::Start(SoftmaxWithEvaluator(metrics));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = ChiefStubOf(**cluster);
  v1::ClusterStatus status = AwaitFinished(*chief, absl::Seconds(240));
  ASSERT_TRUE(status.progress().finished()) << status.DebugString() << (*cluster)->Logs();
  EXPECT_EQ(status.phase(), v1::FINISHED);
  EXPECT_EQ(status.global_step(), 360);
  // The final evaluation is the evaluator's, of the final model.
  EXPECT_EQ(status.progress().test_evaluated_by(), "evaluator:0");
  EXPECT_EQ(status.progress().test_step(), 360);
  EXPECT_GE(status.progress().test_accuracy(), 0.75) << status.DebugString();
  // Every evaluation in the chief's metrics file came from the evaluator: the chief computed
  // none, although its own --eval_every_secs=1 would have had it evaluate every second.
  std::vector<std::string> lines = Lines(metrics);
  ASSERT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    EXPECT_THAT(line, HasSubstr("\"evaluated_by\": \"evaluator:0\"")) << line;
  }
  EXPECT_THAT(lines.back(), HasSubstr("\"step\": 360"));
  // Each names the training time its model was read at, which never goes back and never passes
  // the chief's training clock.
  double last_read = 0;
  for (const Evaluated& e : EvaluationsIn(lines)) {
    EXPECT_GE(e.training_seconds, last_read) << e.step;
    last_read = e.training_seconds;
  }
  EXPECT_LE(last_read, status.progress().elapsed_seconds());
  EXPECT_GT(last_read, 0);
  // The evaluator was told training is over and exits 0 (--exit_after_training).
  absl::StatusOr<int> exit = (*cluster)->evaluator().WaitForExit(absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status() << (*cluster)->evaluator().LogTail();
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;
}

// --eval_every_steps: an evaluation each time the global step has moved 50 steps since the
// last (steps of 50 examples: every 2,500 examples), whatever the time, and the final one.
TEST(EvaluatorTest, TheEvaluatorCanEvaluateEveryNSteps) {
  const std::string metrics = absl::StrCat(getenv("TEST_TMPDIR"), "/metrics-steps.jsonl");
  TestClusterOptions options = SoftmaxWithEvaluator(metrics);
  options.flags["evaluator"] = {"--eval_every_steps=50", "--exit_after_training"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = ChiefStubOf(**cluster);
  v1::ClusterStatus status = AwaitFinished(*chief, absl::Seconds(240));
  ASSERT_TRUE(status.progress().finished()) << status.DebugString() << (*cluster)->Logs();
  EXPECT_EQ(status.progress().test_step(), 360);
  std::vector<Evaluated> evaluated = EvaluationsIn(Lines(metrics));
  // Training takes a second or two: by time (15 s by default) there would be none before the
  // final one; by steps there are several (the evaluator may start some steps late), each at
  // least 50 steps after the one before.
  ASSERT_GE(evaluated.size(), 3u) << (*cluster)->evaluator().LogTail(50);
  int64_t last_step = 0;
  double last_read = 0;
  for (size_t i = 0; i + 1 < evaluated.size(); ++i) {
    EXPECT_GE(evaluated[i].step, last_step + 50) << i;
    EXPECT_GE(evaluated[i].training_seconds, last_read) << i;
    last_step = evaluated[i].step;
    last_read = evaluated[i].training_seconds;
  }
  EXPECT_EQ(evaluated.back().step, 360);
}

TEST(EvaluatorTest, TheChiefEvaluatesTheFinalModelWhenTheEvaluatorIsGone) {
  const std::string metrics = absl::StrCat(getenv("TEST_TMPDIR"), "/metrics-fallback.jsonl");
  TestClusterOptions options = SoftmaxWithEvaluator(metrics);
  options.flags["chief"].push_back("--final_eval_timeout_secs=2");
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->evaluator().Signal(SIGKILL).ok());
  auto chief = ChiefStubOf(**cluster);
  v1::ClusterStatus status = AwaitFinished(*chief, absl::Seconds(240));
  ASSERT_TRUE(status.progress().finished()) << status.DebugString() << (*cluster)->Logs();
  EXPECT_EQ(status.progress().test_evaluated_by(), "chief");
  EXPECT_EQ(status.progress().test_step(), 360);
  EXPECT_GE(status.progress().test_accuracy(), 0.75);
  EXPECT_THAT((*cluster)->chief().LogTail(200),
              HasSubstr("evaluator:0 sent no evaluation of the final step 360"));
  std::vector<std::string> lines = Lines(metrics);
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back(), HasSubstr("\"evaluated_by\": \"chief\""));
}

TEST(EvaluatorTest, BadReportsAreRefusedAndChangeNothing) {
  TestClusterOptions options = EndlessSyncTraining(1, 1);
  options.num_evaluators = 1;
  options.flags["evaluator"] = {"--eval_every_secs=1000"};  // it stays quiet
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = ChiefStubOf(**cluster);
  ASSERT_TRUE(AwaitGlobalStep(*chief, 5)) << (*cluster)->Logs();

  const auto report = [&](const std::function<void(v1::ReportEvaluationRequest*)>& edit) {
    v1::ReportEvaluationRequest req;
    req.mutable_task()->set_job("evaluator");
    req.mutable_task()->set_index(0);
    req.set_step(1);
    req.set_examples(100);
    req.set_loss(0.5);
    req.set_accuracy(0.5);
    req.set_auc(-1);
    edit(&req);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ReportEvaluationResponse resp;
    return chief->ReportEvaluation(&ctx, req, &resp);
  };
  struct Case {
    std::function<void(v1::ReportEvaluationRequest*)> edit;
    grpc::StatusCode code;
    std::string message;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Case> cases = {
      {[](auto* r) { r->mutable_task()->set_job("worker"); }, grpc::StatusCode::INVALID_ARGUMENT,
       "reported by the evaluator task (evaluator:0), not by worker:0"},
      {[](auto* r) { r->set_step(1'000'000'000); }, grpc::StatusCode::INVALID_ARGUMENT,
       "evaluation of step 1000000000: expected a step in [0, "},
      {[](auto* r) { r->set_step(-1); }, grpc::StatusCode::INVALID_ARGUMENT,
       "evaluation of step -1"},
      {[](auto* r) { r->set_examples(0); }, grpc::StatusCode::INVALID_ARGUMENT,
       "evaluation of 0 examples: expected at least 1"},
      {[nan](auto* r) { r->set_loss(nan); }, grpc::StatusCode::INVALID_ARGUMENT,
       "evaluation loss nan: expected a finite value >= 0"},
      {[](auto* r) { r->set_accuracy(1.5); }, grpc::StatusCode::INVALID_ARGUMENT,
       "evaluation accuracy 1.5: expected a value in [0, 1]"},
      {[](auto* r) { r->set_auc(2); }, grpc::StatusCode::INVALID_ARGUMENT,
       "evaluation AUC 2: expected a value in [0, 1], or -1 for none"},
      {[](auto* r) { r->set_training_seconds(-1); }, grpc::StatusCode::INVALID_ARGUMENT,
       "evaluation of the model read at -1 s of training: expected a time in [0, "},
      {[](auto* r) { r->set_training_seconds(1e9); }, grpc::StatusCode::INVALID_ARGUMENT,
       "evaluation of the model read at 1e+09 s of training: expected a time in [0, "},
      {[nan](auto* r) { r->set_training_seconds(nan); }, grpc::StatusCode::INVALID_ARGUMENT,
       "evaluation of the model read at nan s of training"},
      {[](auto* r) { r->set_final(true); }, grpc::StatusCode::FAILED_PRECONDITION,
       "a final evaluation is not expected: the chief is TRAINING"},
  };
  for (const Case& c : cases) {
    grpc::Status s = report(c.edit);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
  }
  // Nothing was recorded, and training goes on.
  v1::ClusterStatus status = ClusterStatusOf(*chief);
  EXPECT_EQ(status.progress().test_accuracy(), -1) << status.DebugString();
  EXPECT_EQ(status.progress().test_evaluated_by(), "");
  EXPECT_EQ(status.phase(), v1::TRAINING);
  EXPECT_TRUE(AwaitGlobalStep(*chief, status.global_step() + 5));
  // A valid report is shown as it is.
  grpc::Status ok = report([](auto* r) {
    r->set_accuracy(0.25);
    r->set_training_seconds(0);
  });
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  status = ClusterStatusOf(*chief);
  EXPECT_EQ(status.progress().test_accuracy(), 0.25);
  EXPECT_EQ(status.progress().test_evaluated_by(), "evaluator:0");
}

TEST(EvaluatorTest, AClusterWithoutAnEvaluatorRefusesReports) {
  auto cluster = TestCluster::Start(EndlessSyncTraining(1, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = ChiefStubOf(**cluster);
  v1::ReportEvaluationRequest req;
  req.mutable_task()->set_job("evaluator");
  req.set_examples(1);
  grpc::ClientContext ctx;
  v1::ReportEvaluationResponse resp;
  grpc::Status s = chief->ReportEvaluation(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("this cluster has no evaluator task"));
}

}  // namespace
}  // namespace pscluster
