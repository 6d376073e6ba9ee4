// The conformance suite on GPU 0, plus what only the CUDA backend has: agreement with the CPU
// on a realistic product, device selection errors and the memory cap. Needs a GPU.

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "kernels/kernels_test_body.h"

namespace pscluster {
namespace {

INSTANTIATE_TEST_SUITE_P(Cuda, KernelsConformanceTest,
                         testing::Values(KernelsFactory{
                             "cuda", []() { return NewCudaKernels(CudaKernelsOptions{}); }}),
                         KernelsFactoryName);

std::unique_ptr<Kernels> NewGpu0(int64_t memory_limit_bytes = 0) {
  CudaKernelsOptions options;
  options.memory_limit_bytes = memory_limit_bytes;
  absl::StatusOr<std::unique_ptr<Kernels>> kernels = NewCudaKernels(options);
  EXPECT_TRUE(kernels.ok()) << kernels.status();
  return kernels.ok() ? std::move(kernels).value() : nullptr;
}

TEST(CudaKernelsTest, NameNamesTheDevice) {
  std::unique_ptr<Kernels> gpu = NewGpu0();
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->name().rfind("cuda:0 (", 0), 0u) << gpu->name();
}

// One MLP layer's product, forward and both backward shapes, on GPU and CPU.
TEST(CudaKernelsTest, GemmAgreesWithCpuOnMlpSizes) {
  std::unique_ptr<Kernels> gpu = NewGpu0();
  ASSERT_NE(gpu, nullptr);
  std::unique_ptr<Kernels> cpu = NewCpuKernels();
  const int batch = 128, in = 784, units = 256;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  const std::vector<float> x = random(int64_t{batch} * in);
  const std::vector<float> w = random(int64_t{in} * units);
  const std::vector<float> dy = random(int64_t{batch} * units);

  struct Product {
    const char* name;
    bool trans_a, trans_b;
    int m, n, k;
    const std::vector<float>* a;
    const std::vector<float>* b;
  };
  const Product products[] = {
      {"x * w", false, false, batch, units, in, &x, &w},
      {"x^T * dy", true, false, in, units, batch, &x, &dy},
      {"dy * w^T", false, true, batch, in, units, &dy, &w},
  };
  for (const Product& p : products) {
    SCOPED_TRACE(p.name);
    const int64_t size = int64_t{p.m} * p.n;
    std::vector<float> results[2];
    Kernels* backends[2] = {gpu.get(), cpu.get()};
    for (int i = 0; i < 2; ++i) {
      Kernels* k = backends[i];
      float* a = k->AllocateFloats(p.a->size()).value();
      float* b = k->AllocateFloats(p.b->size()).value();
      float* c = k->AllocateFloats(size).value();
      k->CopyToDevice(p.a->data(), a, p.a->size());
      k->CopyToDevice(p.b->data(), b, p.b->size());
      k->Gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, 1.0f, a, b, 0.0f, c);
      results[i].resize(size);
      k->CopyToHost(c, results[i].data(), size);
      k->Free(a);
      k->Free(b);
      k->Free(c);
    }
    // Terms are in [-1, 1] and the results around sqrt(k) / 3. FP32 rounding stays far below
    // 1e-6 * k (about 1e-5 here); TF32 products (10-bit mantissas) would be off by about 1e-3.
    const double tolerance = 1e-6 * p.k;
    int misses = 0;
    for (int64_t i = 0; i < size; ++i) {
      if (std::abs(double{results[0][i]} - results[1][i]) > tolerance && ++misses <= 5) {
        ADD_FAILURE() << "[" << i << "]: cuda " << results[0][i] << ", cpu " << results[1][i];
      }
    }
    EXPECT_EQ(misses, 0);
  }
}

TEST(CudaKernelsTest, MissingDeviceIsFailedPrecondition) {
  CudaKernelsOptions options;
  options.device = 99;
  absl::StatusOr<std::unique_ptr<Kernels>> kernels = NewCudaKernels(options);
  EXPECT_EQ(kernels.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(kernels.status().message().find("GPU 99"), std::string::npos) << kernels.status();
}

TEST(CudaKernelsTest, NegativeMemoryLimitIsInvalidArgument) {
  CudaKernelsOptions options;
  options.memory_limit_bytes = -1;
  EXPECT_EQ(NewCudaKernels(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaKernelsTest, MemoryLimitIsEnforced) {
  const int64_t limit = 1 << 20;
  std::unique_ptr<Kernels> gpu = NewGpu0(limit);
  ASSERT_NE(gpu, nullptr);
  absl::StatusOr<float*> first = gpu->AllocateFloats(200 * 1024);  // 800 KiB
  ASSERT_TRUE(first.ok()) << first.status();

  absl::StatusOr<float*> second = gpu->AllocateFloats(100 * 1024);  // 400 KiB: over 1 MiB
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(second.status().message());
  EXPECT_NE(message.find("409600 bytes"), std::string::npos) << message;  // requested
  EXPECT_NE(message.find("819200 bytes in use"), std::string::npos) << message;
  EXPECT_NE(message.find("limit 1048576"), std::string::npos) << message;

  absl::StatusOr<int32_t*> ints = gpu->AllocateInts(100 * 1024);
  EXPECT_EQ(ints.status().code(), absl::StatusCode::kResourceExhausted);

  // Freed memory counts no more.
  gpu->Free(*first);
  second = gpu->AllocateFloats(100 * 1024);
  ASSERT_TRUE(second.ok()) << second.status();
  gpu->Free(*second);
}

TEST(CudaKernelsTest, AllocationBeyondTheDeviceIsResourceExhausted) {
  std::unique_ptr<Kernels> gpu = NewGpu0();
  ASSERT_NE(gpu, nullptr);
  // 4 TiB: more than any GPU holds.
  absl::StatusOr<float*> huge = gpu->AllocateFloats(int64_t{1} << 40);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  // The failed cudaMalloc leaves no error behind for the next kernel.
  absl::StatusOr<float*> small = gpu->AllocateFloats(16);
  ASSERT_TRUE(small.ok()) << small.status();
  gpu->Fill(*small, 16, 2.0f);
  std::vector<float> host(16);
  gpu->CopyToHost(*small, host.data(), 16);
  EXPECT_EQ(host, std::vector<float>(16, 2.0f));
}

}  // namespace
}  // namespace pscluster
