#include <memory>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "kernels/kernels_test_body.h"

namespace pscluster {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Cpu, KernelsConformanceTest,
    testing::Values(KernelsFactory{
        "cpu", []() -> absl::StatusOr<std::unique_ptr<Kernels>> { return NewCpuKernels(); }}),
    KernelsFactoryName);

TEST(CpuKernelsTest, NameIsCpu) { EXPECT_EQ(NewCpuKernels()->name(), "cpu"); }

}  // namespace
}  // namespace pscluster
