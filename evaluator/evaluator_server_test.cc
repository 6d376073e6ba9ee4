#include "evaluator/evaluator_server.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

EvaluatorOptions OptionsFor(const std::string& job, int index) {
  EvaluatorOptions options;
  options.cluster.mutable_task()->set_job(job);
  options.cluster.mutable_task()->set_index(index);
  return options;
}

TEST(EvaluatorServerTest, RefusesBadOptionsNamingWhatWasWrong) {
  EXPECT_TRUE(EvaluatorServer::Create(OptionsFor("evaluator", 0)).ok());

  absl::StatusOr<std::unique_ptr<EvaluatorServer>> s =
      EvaluatorServer::Create(OptionsFor("worker", 1));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("the evaluator must run as task evaluator:0, not worker:1"));

  s = EvaluatorServer::Create(OptionsFor("evaluator", 1));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);

  EvaluatorOptions options = OptionsFor("evaluator", 0);
  options.eval_every = absl::ZeroDuration();
  s = EvaluatorServer::Create(options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("the evaluation interval (0) and the polling interval (250ms) must be "
                        "positive"));

  options = OptionsFor("evaluator", 0);
  options.eval_every_steps = -5;
  s = EvaluatorServer::Create(options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("the evaluation interval in steps (-5) must be positive, or 0 for none"));

  for (const char* device : {"tpu:0", "gpu:", "gpu:-1", "gpu:x"}) {
    options = OptionsFor("evaluator", 0);
    options.device = device;
    s = EvaluatorServer::Create(options);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << device;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("--device must be cpu or gpu:N"));
  }
  options = OptionsFor("evaluator", 0);
  options.device = "gpu:1";
  EXPECT_TRUE(EvaluatorServer::Create(options).ok());
}

// A GPU that cannot be used (none in a CPU build; no device 999 anywhere) stops the daemon at
// start, naming the flag, instead of failing every evaluation.
TEST(EvaluatorServerTest, AGpuThatCannotBeUsedFailsTheStart) {
  EvaluatorOptions options = OptionsFor("evaluator", 0);
  options.device = "gpu:999";
  auto server = EvaluatorServer::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::Status s = (*server)->Start();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("--device=gpu:999: "));
}

}  // namespace
}  // namespace pscluster
