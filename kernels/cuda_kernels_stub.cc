// NewCudaKernels for binaries built without --config=cuda.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernels.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<Kernels>> NewCudaKernels(const CudaKernelsOptions& /*options*/) {
  return absl::UnimplementedError("this binary was built without CUDA; rebuild with --config=cuda");
}

absl::StatusOr<std::unique_ptr<TowerReducer>> NewCudaTowerReducer(
    const std::vector<Kernels*>& /*towers*/) {
  return absl::UnimplementedError("this binary was built without CUDA; rebuild with --config=cuda");
}

}  // namespace pscluster
