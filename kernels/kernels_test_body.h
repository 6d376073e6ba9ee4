#ifndef PSCLUSTER_KERNELS_KERNELS_TEST_BODY_H_
#define PSCLUSTER_KERNELS_KERNELS_TEST_BODY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"

namespace pscluster {

// One Kernels implementation under test: a name for the test output and a way to make one.
struct KernelsFactory {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<Kernels>>()> create;
};

// Prints the name only (gtest would otherwise dump the std::function's bytes).
inline void PrintTo(const KernelsFactory& factory, std::ostream* os) { *os << factory.name; }

// Test suite names: "Cpu/KernelsConformanceTest.Gemm/cpu".
inline std::string KernelsFactoryName(const testing::TestParamInfo<KernelsFactory>& info) {
  return info.param.name;
}

// The conformance tests every Kernels backend must pass, comparing each method with a
// double-precision reference computed in the test (kernels_test_body.cc). Instantiate with
//   INSTANTIATE_TEST_SUITE_P(Cpu, KernelsConformanceTest,
//                            testing::Values(KernelsFactory{"cpu", ...}), KernelsFactoryName);
class KernelsConformanceTest : public testing::TestWithParam<KernelsFactory> {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Device buffers holding `values` (or n copies of `value`); freed in TearDown.
  float* Upload(const std::vector<float>& values);
  int32_t* UploadInts(const std::vector<int32_t>& values);
  float* Filled(int64_t n, float value);
  std::vector<float> Download(const float* device, int64_t n);
  std::vector<int32_t> DownloadInts(const int32_t* device, int64_t n);

  std::unique_ptr<Kernels> kernels_;

 private:
  std::vector<void*> owned_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_KERNELS_KERNELS_TEST_BODY_H_
