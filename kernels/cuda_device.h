#ifndef PSCLUSTER_KERNELS_CUDA_DEVICE_H_
#define PSCLUSTER_KERNELS_CUDA_DEVICE_H_

#include <cstdint>
#include <string>

namespace pscluster {

struct CudaDeviceInfo {
  // False when the device cannot be used; `error` then says why.
  bool ok = false;
  std::string error;
  int ordinal = 0;
  int visible_devices = 0;
  std::string name;
  int64_t total_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

// Describes CUDA device `ordinal` as CUDA_VISIBLE_DEVICES exposes it, or why it cannot be
// used (no driver, no such device). Thread-safe. Only built with --config=cuda.
CudaDeviceInfo ProbeCudaDevice(int ordinal);

}  // namespace pscluster

#endif  // PSCLUSTER_KERNELS_CUDA_DEVICE_H_
