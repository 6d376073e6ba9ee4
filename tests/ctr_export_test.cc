// bench/ctr_export, the tool that hands bench/torch_ctr.py the features our workers see: its
// arrays are exactly what the Criteo reader gives for the same file, and a file the reader
// refuses writes nothing.
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/data/criteo.h"
#include "testing/child_process.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::vector<T> ReadArray(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  EXPECT_EQ(bytes.size() % sizeof(T), 0u) << path;
  return values;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << text;
  return path;
}

// 3 integer and 2 categorical columns; empty fields, a negative count, a repeated value.
constexpr char kLines[] =
    "1\t5\t\t-3\tab12\tcd34\n"
    "0\t0\t7\t100\t\tab12\n"
    "0\t\t\t\t\t\n";

TEST(CtrExportTest, WritesWhatTheCriteoReaderGives) {
  const std::string in = WriteFile("train.txt", kLines);
  const std::string prefix = absl::StrCat(std::getenv("TEST_TMPDIR"), "/out");
  for (const int64_t buckets : {int64_t{0}, int64_t{1000}}) {
    SCOPED_TRACE(buckets);
    ShellResult r = RunShellCommand(
        absl::StrCat(RunfilePath("bench/ctr_export"), " --in=", in, " --out_prefix=", prefix,
                     " --num_int=3 --num_cat=2 --hash_buckets=", buckets),
        prefix + ".log");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("EXPORT examples=3 dense_dim=3 ids=3 distinct_ids=3"));
    CriteoOptions options;
    options.num_int = 3;
    options.num_cat = 2;
    options.hash_buckets = buckets;
    absl::StatusOr<Dataset> want = ReadCriteo(in, options);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(ReadArray<float>(prefix + ".dense"), want->dense);
    EXPECT_EQ(ReadArray<float>(prefix + ".labels"), want->labels);
    EXPECT_EQ(ReadArray<int64_t>(prefix + ".offsets"), want->sparse_offsets);
    EXPECT_EQ(ReadArray<int64_t>(prefix + ".ids"), want->sparse_ids);
    EXPECT_EQ(want->sparse_offsets, (std::vector<int64_t>{0, 2, 3, 3}));
  }
}

TEST(CtrExportTest, AFileTheReaderRefusesWritesNothing) {
  const std::string in = WriteFile("bad.txt", "1\t5\t\t-3\tab12\tcd34\n2\t0\t7\t100\t\tab12\n");
  const std::string prefix = absl::StrCat(std::getenv("TEST_TMPDIR"), "/bad");
  ShellResult r =
      RunShellCommand(absl::StrCat(RunfilePath("bench/ctr_export"), " --in=", in,
                                   " --out_prefix=", prefix, " --num_int=3 --num_cat=2"),
                      prefix + ".log");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(in + ":2: bad label '2': expected 0 or 1"));
  for (const char* suffix : {".dense", ".labels", ".offsets", ".ids"}) {
    EXPECT_FALSE(std::filesystem::exists(prefix + suffix)) << suffix;
  }
  ShellResult usage = RunShellCommand(RunfilePath("bench/ctr_export"), prefix + ".usage.log");
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
  EXPECT_THAT(usage.output, HasSubstr("--in and --out_prefix are required"));
}

}  // namespace
}  // namespace pscluster
