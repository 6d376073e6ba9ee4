// NewTowerReducer: the CPU reducer here; CUDA towers go to NCCL (cuda_kernels.cu, or the stub
// without --config=cuda).

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"

namespace pscluster {
namespace {

// One tower: nothing to sum.
class SingleTowerReducer final : public TowerReducer {
 public:
  absl::Status AllReduceSum(const std::vector<float*>&, int64_t) override {
    return absl::OkStatus();
  }
};

// CPU towers: every buffer is host memory, and the compute methods have finished when they
// return, so the sum is a loop (in tower order, so every buffer gets the same bits).
class HostTowerReducer final : public TowerReducer {
 public:
  explicit HostTowerReducer(int towers) : towers_(towers) {}
  absl::Status AllReduceSum(const std::vector<float*>& buffers, int64_t n) override {
    if (static_cast<int>(buffers.size()) != towers_) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllReduceSum of ", buffers.size(), " buffers over ", towers_, " towers"));
    }
    for (int64_t i = 0; i < n; ++i) {
      float sum = buffers[0][i];
      for (int t = 1; t < towers_; ++t) sum += buffers[t][i];
      for (int t = 0; t < towers_; ++t) buffers[t][i] = sum;
    }
    return absl::OkStatus();
  }

 private:
  const int towers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TowerReducer>> NewTowerReducer(const std::vector<Kernels*>& towers) {
  if (towers.empty()) return absl::InvalidArgumentError("a tower reducer needs a tower");
  if (towers.size() == 1) return std::unique_ptr<TowerReducer>(new SingleTowerReducer());
  const bool host = towers[0]->device_is_host();
  for (Kernels* k : towers) {
    if (k->device_is_host() != host) {
      return absl::InvalidArgumentError(
          absl::StrCat("towers of mixed backends: ", towers[0]->name(), " and ", k->name()));
    }
  }
  if (host) {
    return std::unique_ptr<TowerReducer>(new HostTowerReducer(static_cast<int>(towers.size())));
  }
  return NewCudaTowerReducer(towers);
}

}  // namespace pscluster
