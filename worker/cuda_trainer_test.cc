// The training-loop suite on GPUs: the pipelined step with device-resident parameters and
// gradients (copy streams, page-locked buffers), against the ps store in this process; the
// towers test when two GPUs are visible (NCCL). Needs a GPU.
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/kernels.h"
#include "worker/trainer_test_body.h"

namespace pscluster {
namespace {

std::vector<std::unique_ptr<Kernels>> Gpus(int n) {
  std::vector<std::unique_ptr<Kernels>> out;
  for (int i = 0; i < n; ++i) {
    CudaKernelsOptions options;
    options.device = i;
    absl::StatusOr<std::unique_ptr<Kernels>> k = NewCudaKernels(options);
    if (!k.ok()) {
      LOG(INFO) << "GPU " << i << ": " << k.status();
      break;
    }
    out.push_back(*std::move(k));
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cuda, TrainerTest,
                         testing::Values(TrainerDevices{"cuda", &Gpus, /*exact=*/false}),
                         TrainerDevicesName);

}  // namespace
}  // namespace pscluster
