#ifndef PSCLUSTER_COMMON_MEMORY_LIMIT_H_
#define PSCLUSTER_COMMON_MEMORY_LIMIT_H_

#include <cstdint>
#include <string>

namespace pscluster {

// The memory this process may use, and where the figure comes from.
struct MemoryLimit {
  int64_t bytes = 0;   // 0: not known
  std::string source;  // "the machine's memory", or the cgroup file that caps it
};

// The smaller of `physical_bytes` (the machine's memory; 0: unknown) and every memory cap of
// the process's cgroups: cgroup v2's memory.max, v1's memory.limit_in_bytes, in the process's
// cgroup (from /proc/self/cgroup) and each cgroup above it that the process can see. A
// container runtime puts a pod's memory limit there (Kubernetes' resources.limits.memory);
// "max" and v1's "no limit" (2^63 rounded to pages) are no cap. Files are read under `root`
// ("/" in production; tests give a tree of their own). A file that is missing or unreadable is
// no cap.
MemoryLimit ProcessMemoryLimit(int64_t physical_bytes, const std::string& root = "/");

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_MEMORY_LIMIT_H_
