#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_device.h"

namespace pscluster {

CudaDeviceInfo ProbeCudaDevice(int ordinal) {
  CudaDeviceInfo info;
  info.ordinal = ordinal;
  cudaError_t err = cudaGetDeviceCount(&info.visible_devices);
  if (err != cudaSuccess) {
    info.error = std::string("no usable CUDA driver or device: ") + cudaGetErrorString(err);
    return info;
  }
  if (ordinal < 0 || ordinal >= info.visible_devices) {
    info.error = "GPU " + std::to_string(ordinal) +
                 " does not exist: " + std::to_string(info.visible_devices) +
                 " visible (CUDA_VISIBLE_DEVICES applies)";
    return info;
  }
  cudaDeviceProp prop;
  err = cudaGetDeviceProperties(&prop, ordinal);
  if (err != cudaSuccess) {
    info.error =
        std::string("cannot query GPU ") + std::to_string(ordinal) + ": " + cudaGetErrorString(err);
    return info;
  }
  info.ok = true;
  info.name = prop.name;
  info.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.compute_capability_major = prop.major;
  info.compute_capability_minor = prop.minor;
  return info;
}

}  // namespace pscluster
