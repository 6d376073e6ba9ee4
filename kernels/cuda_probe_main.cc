// cuda_probe: prints what the worker would see of a GPU. Exits 1 if it cannot be used.
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda_device.h"

int main(int argc, char** argv) {
  const int ordinal = argc > 1 ? std::atoi(argv[1]) : 0;
  pscluster::CudaDeviceInfo info = pscluster::ProbeCudaDevice(ordinal);
  if (!info.ok) {
    std::fprintf(stderr, "cuda_probe: %s\n", info.error.c_str());
    return 1;
  }
  std::printf("gpu:%d %s, %.1f GiB, compute capability %d.%d, %d visible\n", info.ordinal,
              info.name.c_str(), info.total_memory_bytes / double(1 << 30),
              info.compute_capability_major, info.compute_capability_minor, info.visible_devices);
  return 0;
}
