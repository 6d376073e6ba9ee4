#include "model/data/input_file.h"

#include <zlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Write(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/input_file_test_", name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  std::fwrite(contents.data(), 1, contents.size(), f);
  std::fclose(f);
  return path;
}

std::string WriteGzip(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/input_file_test_", name);
  gzFile gz = gzopen(path.c_str(), "wb");
  EXPECT_NE(gz, nullptr) << path;
  EXPECT_EQ(gzwrite(gz, contents.data(), contents.size()), static_cast<int>(contents.size()));
  EXPECT_EQ(gzclose(gz), Z_OK);
  return path;
}

std::vector<std::string> AllLines(const std::string& path) {
  auto reader = LineReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> lines;
  std::string line;
  while (true) {
    auto more = (*reader)->Next(&line);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    lines.push_back(line);
    EXPECT_EQ((*reader)->line_number(), static_cast<int64_t>(lines.size()));
  }
  return lines;
}

TEST(LineReaderTest, SplitsAtNewlinesAndDropsOneCarriageReturn) {
  EXPECT_THAT(AllLines(Write("unix", "a\nbb\n\nc\n")), ElementsAre("a", "bb", "", "c"));
  EXPECT_THAT(AllLines(Write("windows", "a\r\nbb\r\n\r\nc\r\n")), ElementsAre("a", "bb", "", "c"));
  EXPECT_THAT(AllLines(Write("no_final", "a\nc")), ElementsAre("a", "c"));
  EXPECT_THAT(AllLines(Write("no_final_cr", "a\nc\r")), ElementsAre("a", "c"));
  EXPECT_THAT(AllLines(Write("double_cr", "a\r\r\n")), ElementsAre("a\r"));
  EXPECT_THAT(AllLines(Write("empty", "")), ElementsAre());
  EXPECT_THAT(AllLines(Write("newline", "\n")), ElementsAre(""));
}

TEST(LineReaderTest, LinesLongerThanTheBufferAndGzip) {
  const std::string long_line(200000, 'x');
  const std::string text = "short\n" + long_line + "\nend";
  EXPECT_THAT(AllLines(Write("long", text)), ElementsAre("short", long_line, "end"));
  EXPECT_THAT(AllLines(WriteGzip("long.gz", text)), ElementsAre("short", long_line, "end"));
}

TEST(LineReaderTest, CutGzipStreamIsAnErrorAtItsEnd) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += absl::StrCat("line ", i, "\n");
  const std::string whole = WriteGzip("whole.gz", text);
  std::FILE* f = std::fopen(whole.c_str(), "rb");
  std::string bytes(1 << 20, '\0');
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  const std::string cut = Write("cut.gz", bytes.substr(0, bytes.size() - 4));
  auto reader = LineReader::Open(cut);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string line;
  absl::StatusOr<bool> more = true;
  while (more.ok() && *more) more = (*reader)->Next(&line);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(more.status().message(),
              HasSubstr(cut + ": truncated gzip stream: it is cut short after offset"));
}

std::string FileBytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  std::string bytes(1 << 20, '\0');
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  return bytes;
}

// Reads the whole file through InputFile and checks that it ends there.
absl::StatusOr<std::string> ReadAll(const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> input, InputFile::Open(path));
  std::string out(1 << 20, '\0');
  PS_ASSIGN_OR_RETURN(const size_t got,
                      input->Read(reinterpret_cast<unsigned char*>(out.data()), out.size()));
  out.resize(got);
  PS_RETURN_IF_ERROR(input->ExpectEnd("the test's data"));
  return out;
}

TEST(InputFileTest, GzipMembersOneAfterAnotherReadAsOneStream) {
  const std::string both = Write("members.gz", FileBytes(WriteGzip("first.gz", "first,")) +
                                                   FileBytes(WriteGzip("second.gz", "second")));
  absl::StatusOr<std::string> read = ReadAll(both);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "first,second");
}

// gzread would stop at the end of the gzip data and ignore what follows; a data file with
// bytes after its gzip stream is refused instead, as a plain file with bytes after its data is.
TEST(InputFileTest, BytesAfterTheGzipStreamAreRefused) {
  const std::string gzip = FileBytes(WriteGzip("data.gz", "the data"));
  for (const std::string& junk :
       {std::string("junk"), std::string(1, '\0'), std::string(600, 'x')}) {
    const std::string path = Write("junk.gz", gzip + junk);
    absl::StatusOr<std::string> read = ReadAll(path);
    ASSERT_FALSE(read.ok()) << "junk of " << junk.size() << " bytes";
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(read.status().message(),
                HasSubstr(absl::StrCat(path, ": ", gzip.size(),
                                       " compressed bytes in, after the gzip data that ends at "
                                       "offset 8 (decompressed), come bytes that are not "
                                       "another gzip member")));
  }
  // A corrupt second member is a corrupt stream.
  const std::string bad = Write("bad_member.gz", gzip + "\x1f\x8b" + std::string(20, 'z'));
  absl::StatusOr<std::string> read = ReadAll(bad);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr(bad + ": corrupt gzip stream at offset 8"));
}

TEST(LineReaderTest, MissingFileIsNotFound) {
  const std::string missing = absl::StrCat(::testing::TempDir(), "/input_file_test_none");
  auto reader = LineReader::Open(missing);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reader.status().message(), HasSubstr("cannot open " + missing));
}

TEST(FindGzipOrPlainTest, PrefersTheGzipFile) {
  const std::string plain = Write("find_both", "x");
  Write("find_both.gz", "x");
  absl::StatusOr<std::string> found = FindGzipOrPlain(plain);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, plain + ".gz");

  const std::string only_plain = Write("find_plain", "x");
  found = FindGzipOrPlain(only_plain);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, only_plain);

  const std::string missing = absl::StrCat(::testing::TempDir(), "/input_file_test_missing");
  found = FindGzipOrPlain(missing);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(),
              HasSubstr(absl::StrCat("neither ", missing, ".gz nor ", missing, " exists")));
}

}  // namespace
}  // namespace pscluster
