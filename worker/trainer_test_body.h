#ifndef PSCLUSTER_WORKER_TRAINER_TEST_BODY_H_
#define PSCLUSTER_WORKER_TRAINER_TEST_BODY_H_

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kernels.h"

namespace pscluster {

// The devices a run of the training-loop tests uses: make(n) gives up to n Kernels (fewer
// when there are not so many devices; the towers test is then skipped). `exact`: the pipeline
// must compute the same bits as the sequential reference (CPU); otherwise within 1e-5
// (GPUs: cuBLAS may pick another algorithm for a different call sequence).
struct TrainerDevices {
  std::string name;
  std::function<std::vector<std::unique_ptr<Kernels>>(int n)> make;
  bool exact = true;
};

inline void PrintTo(const TrainerDevices& d, std::ostream* os) { *os << d.name; }

// The same variables, each element within 1e-5 (relative above 1).
inline void ExpectNearModel(const std::vector<std::vector<float>>& got,
                            const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t v = 0; v < got.size(); ++v) {
    ASSERT_EQ(got[v].size(), want[v].size());
    for (size_t i = 0; i < got[v].size(); ++i) {
      ASSERT_NEAR(got[v][i], want[v][i], 1e-5 * std::max(1.0f, std::abs(want[v][i])))
          << "variable " << v << " element " << i;
    }
  }
}
inline std::string TrainerDevicesName(const testing::TestParamInfo<TrainerDevices>& info) {
  return info.param.name;
}

// The suite (trainer_test_body.cc): the loop in every mode, the pipeline's staleness, pushes
// whose answers were lost, towers, the async gate's drain.
class TrainerTest : public testing::TestWithParam<TrainerDevices> {
 protected:
  std::vector<std::unique_ptr<Kernels>> Devices(int n) { return GetParam().make(n); }

  void ExpectSameModel(const std::vector<std::vector<float>>& got,
                       const std::vector<std::vector<float>>& want) {
    if (!GetParam().exact) {
      ExpectNearModel(got, want);
      return;
    }
    ASSERT_EQ(got.size(), want.size());
    for (size_t v = 0; v < got.size(); ++v) {
      ASSERT_EQ(got[v].size(), want[v].size());
      for (size_t i = 0; i < got[v].size(); ++i) {
        ASSERT_EQ(got[v][i], want[v][i]) << "variable " << v << " element " << i;
      }
    }
  }
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_TRAINER_TEST_BODY_H_
