#include "cli/command_output.h"

#include <cmath>
#include <vector>

#include "cli/psctl_report.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::ValueStats StatsOf(const std::vector<double>& v) {
  v1::ValueStats s;
  double sum = 0, sq = 0;
  s.set_min(v.empty() ? 0 : v[0]);
  s.set_max(v.empty() ? 0 : v[0]);
  for (double x : v) {
    sum += x;
    sq += x * x;
    s.set_min(std::min(s.min(), x));
    s.set_max(std::max(s.max(), x));
  }
  s.set_count(v.size());
  if (v.empty()) return s;
  s.set_mean(sum / v.size());
  s.set_std(std::sqrt(sq / v.size() - s.mean() * s.mean()));
  s.set_l2_norm(std::sqrt(sq));
  return s;
}

TEST(CommandOutputTest, CombinedStatisticsEqualThoseOfTheUnion) {
  v1::ValueStats a = StatsOf({1, 2, 3});
  a.set_nan_count(2);
  v1::ValueStats b = StatsOf({-4, 10});
  b.set_inf_count(1);
  v1::ValueStats all = StatsOf({1, 2, 3, -4, 10});
  v1::ValueStats c = CombineValueStats(a, b);
  EXPECT_EQ(c.count(), 5);
  EXPECT_EQ(c.min(), -4);
  EXPECT_EQ(c.max(), 10);
  EXPECT_NEAR(c.mean(), all.mean(), 1e-12);
  EXPECT_NEAR(c.std(), all.std(), 1e-12);
  EXPECT_NEAR(c.l2_norm(), all.l2_norm(), 1e-12);
  EXPECT_EQ(c.nan_count(), 2);
  EXPECT_EQ(c.inf_count(), 1);

  // An empty side (all NaN, say) does not drag min and max to 0.
  v1::ValueStats empty;
  empty.set_nan_count(3);
  c = CombineValueStats(empty, b);
  EXPECT_EQ(c.min(), -4);
  EXPECT_EQ(c.count(), 2);
  EXPECT_EQ(c.nan_count(), 3);
  EXPECT_EQ(CombineValueStats(b, empty).min(), -4);
}

TEST(CommandOutputTest, HumanReadableSizesShapesAndOptimizers) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(int64_t{3} << 30), "3.0 GiB");
  v1::TensorShape shape;
  EXPECT_EQ(ShapeString(shape), "[]");
  shape.add_dims(64);
  shape.add_dims(16);
  EXPECT_EQ(ShapeString(shape), "[64, 16]");
  EXPECT_EQ(DtypeName(v1::DT_INVALID), "float32");

  v1::OptimizerSpec opt;
  EXPECT_EQ(OptimizerDescription(opt), "none");
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "adam { learning_rate: 0.5 beta1: 0.25 } decay { decay_rate: 0.5 decay_steps: 1000 }", &opt));
  EXPECT_EQ(OptimizerDescription(opt),
            "adam(learning_rate=0.5, beta1=0.25) decay(decay_rate=0.5, decay_steps=1000)");
}

TEST(CommandOutputTest, JsonUsesProtoFieldNamesAndParsesBack) {
  psctl::VarsReport report;
  report.set_num_ps(2);
  psctl::VariableInfo* v = report.add_variables();
  v->set_name("dense/kernel");
  v->add_shape(784);
  const std::string json = ReportToJson(report);
  EXPECT_THAT(json, HasSubstr("\"num_ps\": 2"));
  EXPECT_THAT(json, HasSubstr("\"placement_version\""));  // defaults are printed too
  psctl::VarsReport back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok());
  EXPECT_EQ(back.variables(0).name(), "dense/kernel");
}

TEST(CommandOutputTest, MergedErrorsKeepTheFirstCodeAndEveryMessage) {
  EXPECT_TRUE(MergeErrors({absl::OkStatus()}).ok());
  absl::Status s = MergeErrors(
      {absl::OkStatus(), absl::UnavailableError("ps:1 down"), absl::NotFoundError("no row")});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "ps:1 down; no row");
  EXPECT_EQ(WithContext(absl::DataLossError("bad"), "w/1").message(), "w/1: bad");
}

}  // namespace
}  // namespace pscluster
