#include "chief/step_reports.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::ReportStepRequest Report(int worker, int64_t step, int64_t examples) {
  v1::ReportStepRequest r;
  r.set_worker(worker);
  r.set_step(step);
  r.set_examples(examples);
  return r;
}

WorkerView Registered(int64_t granted_steps = 0) {
  WorkerView v;
  v.registered = true;
  v.granted_steps = granted_steps;
  return v;
}

void ExpectRefused(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(s.message(), HasSubstr(text)) << s;
}

TEST(StepReportsTest, AcceptsWhatARealWorkerSends) {
  EXPECT_TRUE(CheckStepReport(Report(1, 11, 50), v1::SYNC, 2, 10, Registered()).ok());
  EXPECT_TRUE(CheckStepReport(Report(1, 0, 0), v1::SYNC, 2, 0, Registered()).ok());
  EXPECT_TRUE(CheckStepReport(Report(0, 40, 400), v1::ASYNC, 2, 0, Registered(40)).ok());
  v1::ReportStepRequest finished = Report(0, 40, 0);
  finished.set_finished(true);
  EXPECT_TRUE(CheckStepReport(finished, v1::SSP, 2, 0, Registered(41)).ok());
}

TEST(StepReportsTest, RefusesValuesNoWorkerCouldSend) {
  ExpectRefused(CheckStepReport(Report(2, 1, 1), v1::SYNC, 2, 10, Registered()),
                absl::StatusCode::kInvalidArgument, "worker 2 is not in the cluster (2 workers)");
  ExpectRefused(CheckStepReport(Report(-1, 1, 1), v1::SYNC, 2, 10, Registered()),
                absl::StatusCode::kInvalidArgument, "worker -1 is not in the cluster");
  ExpectRefused(CheckStepReport(Report(0, 5, -3), v1::SYNC, 2, 10, Registered()),
                absl::StatusCode::kInvalidArgument, "worker:0 reports examples -3; expected");
  ExpectRefused(CheckStepReport(Report(0, -1, 3), v1::SYNC, 2, 10, Registered()),
                absl::StatusCode::kInvalidArgument, "reports step -1");
  v1::ReportStepRequest r = Report(0, 5, 3);
  r.set_epoch(-2);
  ExpectRefused(CheckStepReport(r, v1::SYNC, 2, 10, Registered()),
                absl::StatusCode::kInvalidArgument, "reports epoch -2");
  r = Report(0, 5, 3);
  r.set_mean_staleness(std::numeric_limits<float>::quiet_NaN());
  ExpectRefused(CheckStepReport(r, v1::ASYNC, 2, 10, Registered(10)),
                absl::StatusCode::kInvalidArgument, "mean_staleness");
  r = Report(0, 5, 3);
  r.set_max_staleness(-1);
  ExpectRefused(CheckStepReport(r, v1::ASYNC, 2, 10, Registered(10)),
                absl::StatusCode::kInvalidArgument, "max_staleness -1");
}

TEST(StepReportsTest, RefusesStepsBeyondWhatTheChiefAllowed) {
  // The report that once made the global step -2.
  const int64_t huge = std::numeric_limits<int64_t>::max();
  ExpectRefused(CheckStepReport(Report(0, huge, 1), v1::SYNC, 2, 10, Registered()),
                absl::StatusCode::kInvalidArgument, "expected at most 1099511627776");
  ExpectRefused(CheckStepReport(Report(0, 5000, 1), v1::SYNC, 2, 10, Registered()),
                absl::StatusCode::kInvalidArgument, "past the global step 10; expected at most 11");
  EXPECT_FALSE(CheckStepReport(Report(0, 12, 1), v1::SYNC, 2, 10, Registered()).ok());
  ExpectRefused(CheckStepReport(Report(0, 5000, 1), v1::ASYNC, 2, 10, Registered(7)),
                absl::StatusCode::kInvalidArgument, "this chief's tokens allow 7");
  EXPECT_FALSE(CheckStepReport(Report(0, 8, 1), v1::SSP, 2, 10, Registered(7)).ok());
  EXPECT_TRUE(CheckStepReport(Report(0, 7, 1), v1::SSP, 2, 10, Registered(7)).ok());
  // Before its first token from this chief (a chief that restarted), an ASYNC count is taken
  // as it is, within the bound that keeps sums from overflowing.
  EXPECT_TRUE(CheckStepReport(Report(0, 5000, 1), v1::ASYNC, 2, 0, Registered(0)).ok());
  ExpectRefused(CheckStepReport(Report(0, huge, 1), v1::ASYNC, 2, 0, Registered(0)),
                absl::StatusCode::kInvalidArgument, "expected at most 1099511627776");
  ExpectRefused(CheckStepReport(Report(0, 3, huge), v1::ASYNC, 2, 0, Registered(0)),
                absl::StatusCode::kInvalidArgument, "examples; expected at most");
}

TEST(StepReportsTest, AWorkerThatHasNotRegisteredIsToldToComeBack) {
  v1::ReportStepRequest finished = Report(1, 0, 0);
  finished.set_finished(true);
  ExpectRefused(CheckStepReport(finished, v1::SYNC, 2, 10, WorkerView()),
                absl::StatusCode::kUnavailable, "worker:1 has not registered with this chief");
}

// A pass grants its step, the steps still running (at most 64 counted) and, with local
// steps, all K of them.
TEST(StepReportsTest, AsyncPassesGrantWhatThePipelineRuns) {
  EXPECT_EQ(AsyncGrantedSteps(10, 0, 1), 11);
  EXPECT_EQ(AsyncGrantedSteps(10, 2, 0), 13);
  EXPECT_EQ(AsyncGrantedSteps(10, 1, 8), 19);
  EXPECT_EQ(AsyncGrantedSteps(10, -5, 1), 11);
  EXPECT_EQ(AsyncGrantedSteps(10, 1 << 30, 1), 75);
}

}  // namespace
}  // namespace pscluster
