// The training-loop suite on the CPU kernels (two CPU "devices" for the towers test).
#include "worker/trainer_test_body.h"

namespace pscluster {
namespace {

std::vector<std::unique_ptr<Kernels>> CpuDevices(int n) {
  std::vector<std::unique_ptr<Kernels>> out;
  for (int i = 0; i < n; ++i) out.push_back(NewCpuKernels());
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cpu, TrainerTest,
                         testing::Values(TrainerDevices{"cpu", &CpuDevices, /*exact=*/true}),
                         TrainerDevicesName);

}  // namespace
}  // namespace pscluster
