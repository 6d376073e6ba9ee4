// Replays every fuzz target over its seed corpus (fuzz/corpus/<target>/) and the inputs that
// once made it crash (fuzz/regressions/<target>/): each target binary, built without libFuzzer
// (fuzz/standalone_main.cc) or with it, runs once over each file. The targets' paths are this
// test's arguments (fuzz/BUILD).
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace {

std::vector<std::string>* targets = nullptr;

std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Runs `binary` over `files`; its exit status (0: every input ran).
int RunOver(const std::string& binary, const std::vector<std::string>& files) {
  std::string command = binary;
  for (const std::string& f : files) absl::StrAppend(&command, " '", f, "'");
  absl::StrAppend(&command, " 2>&1 | tail -n 40");
  // `tail` would hide the status: run it through bash with pipefail.
  const std::string shell = absl::StrCat("bash -o pipefail -c \"", command, "\"");
  const int status = std::system(shell.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(CorpusTest, EveryTargetRunsOverItsCorpusAndRegressions) {
  ASSERT_NE(targets, nullptr);
  ASSERT_FALSE(targets->empty());
  for (const std::string& target : *targets) {
    const std::string name = std::filesystem::path(target).filename().string();
    std::vector<std::string> files = FilesUnder(absl::StrCat("fuzz/corpus/", name));
    EXPECT_FALSE(files.empty()) << "no seed corpus for " << name << " in fuzz/corpus/" << name;
    const std::vector<std::string> regressions =
        FilesUnder(absl::StrCat("fuzz/regressions/", name));
    files.insert(files.end(), regressions.begin(), regressions.end());
    SCOPED_TRACE(name);
    EXPECT_EQ(RunOver(target, files), 0)
        << name << " failed on one of: " << absl::StrJoin(files, " ");
  }
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  targets = new std::vector<std::string>(argv + 1, argv + argc);
  return RUN_ALL_TESTS();
}
