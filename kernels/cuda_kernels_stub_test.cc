// Runs only in builds without --config=cuda, where NewCudaKernels is the stub.

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"

namespace pscluster {
namespace {

TEST(CudaKernelsStubTest, SaysToRebuildWithCuda) {
  absl::StatusOr<std::unique_ptr<Kernels>> kernels = NewCudaKernels(CudaKernelsOptions{});
  EXPECT_EQ(kernels.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(kernels.status().message().find("--config=cuda"), std::string::npos)
      << kernels.status();
}

}  // namespace
}  // namespace pscluster
