#include "common/memory_limit.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pscluster {
namespace {

// A cap read from a cgroup file; 0 for none ("max", a value past 2^62, missing, unreadable).
int64_t ReadCap(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return 0;
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value)) return 0;  // "max"
  constexpr int64_t kNoLimit = int64_t{1} << 62;  // v1 reports 2^63 - 1 rounded to pages
  return value > 0 && value < kNoLimit ? value : 0;
}

// `path` ("/a/b") and the cgroups above it ("/a", "/"), each as a folder under `base`.
std::vector<std::string> CgroupAndParents(const std::string& base, std::string path) {
  std::vector<std::string> folders;
  while (true) {
    folders.push_back(base + (path == "/" ? "" : path));
    if (path.empty() || path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return folders;
}

}  // namespace

MemoryLimit ProcessMemoryLimit(int64_t physical_bytes, const std::string& root) {
  MemoryLimit limit;
  if (physical_bytes > 0) {
    limit.bytes = physical_bytes;
    limit.source = "the machine's memory";
  }
  const std::string prefix = root == "/" ? "" : root;
  auto consider = [&limit](const std::string& file) {
    const int64_t cap = ReadCap(file);
    if (cap > 0 && (limit.bytes == 0 || cap < limit.bytes)) {
      limit.bytes = cap;
      limit.source = file;
    }
  };
  // Lines "hierarchy-ID:controllers:path": v2's is "0::/path"; v1's memory controller's names
  // "memory" among its controllers.
  std::ifstream cgroups(prefix + "/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    const std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3 || fields[2].empty() || fields[2][0] != '/') continue;
    if (fields[0] == "0" && fields[1].empty()) {
      for (const std::string& folder : CgroupAndParents(prefix + "/sys/fs/cgroup", fields[2])) {
        consider(folder + "/memory.max");
      }
      continue;
    }
    const std::vector<std::string> controllers = absl::StrSplit(fields[1], ',');
    for (const std::string& c : controllers) {
      if (c != "memory") continue;
      for (const std::string& folder :
           CgroupAndParents(prefix + "/sys/fs/cgroup/memory", fields[2])) {
        consider(folder + "/memory.limit_in_bytes");
      }
    }
  }
  return limit;
}

}  // namespace pscluster
