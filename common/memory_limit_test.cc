#include "common/memory_limit.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGiB = int64_t{1} << 30;

// A root of its own for each test: proc/self/cgroup and sys/fs/cgroup files under it.
class MemoryLimitTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(testing::TempDir()) /
            testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void Write(const std::string& path, const std::string& text) {
    const fs::path p = root_ / path;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string root() const { return root_.string(); }

 private:
  fs::path root_;
};

TEST_F(MemoryLimitTest, WithoutCgroupsTheMachinesMemory) {
  const MemoryLimit limit = ProcessMemoryLimit(64 * kGiB, root());
  EXPECT_EQ(limit.bytes, 64 * kGiB);
  EXPECT_EQ(limit.source, "the machine's memory");
  EXPECT_EQ(ProcessMemoryLimit(0, root()).bytes, 0);
}

// A pod's container: cgroup v2 with its own namespace ("0::/"), the limit at the root.
TEST_F(MemoryLimitTest, CgroupV2LimitOfAPodCapsTheMachinesMemory) {
  Write("proc/self/cgroup", "0::/\n");
  Write("sys/fs/cgroup/memory.max", "4294967296\n");
  const MemoryLimit limit = ProcessMemoryLimit(64 * kGiB, root());
  EXPECT_EQ(limit.bytes, 4 * kGiB);
  EXPECT_EQ(limit.source, root() + "/sys/fs/cgroup/memory.max");
}

// Without a cgroup namespace the process's path is the host's; the smallest cap on the way up
// counts, and "max" is none.
TEST_F(MemoryLimitTest, CgroupV2SmallestCapOnThePathUp) {
  Write("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  Write("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  Write("sys/fs/cgroup/kubepods/pod1/memory.max", "2147483648\n");
  Write("sys/fs/cgroup/kubepods/memory.max", "8589934592\n");
  const MemoryLimit limit = ProcessMemoryLimit(64 * kGiB, root());
  EXPECT_EQ(limit.bytes, 2 * kGiB);
  EXPECT_EQ(limit.source, root() + "/sys/fs/cgroup/kubepods/pod1/memory.max");
}

TEST_F(MemoryLimitTest, CgroupV1MemoryControllerAndItsNoLimitValue) {
  Write("proc/self/cgroup", "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n");
  Write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "1073741824\n");
  EXPECT_EQ(ProcessMemoryLimit(64 * kGiB, root()).bytes, kGiB);
  // 2^63 - 1 rounded down to 4 KiB pages: v1's "no limit".
  Write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(ProcessMemoryLimit(64 * kGiB, root()).bytes, 64 * kGiB);
}

// A cap above the machine's memory changes nothing; garbage is no cap.
TEST_F(MemoryLimitTest, LargerCapsAndGarbageAreIgnored) {
  Write("proc/self/cgroup", "0::/\n");
  Write("sys/fs/cgroup/memory.max", "137438953472\n");
  EXPECT_EQ(ProcessMemoryLimit(64 * kGiB, root()).source, "the machine's memory");
  Write("sys/fs/cgroup/memory.max", "lots\n");
  EXPECT_EQ(ProcessMemoryLimit(64 * kGiB, root()).bytes, 64 * kGiB);
}

}  // namespace
}  // namespace pscluster
