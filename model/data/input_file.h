#ifndef PSCLUSTER_MODEL_DATA_INPUT_FILE_H_
#define PSCLUSTER_MODEL_DATA_INPUT_FILE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// zlib's z_stream; declared here so that users do not include zlib.h.
struct z_stream_s;

namespace pscluster {

// A data file read front to back, gunzipped on the fly when it starts with the gzip magic
// (1f 8b) -- decided by its first two bytes, never by its name. A gzip file may hold several
// members one after another (as `cat a.gz b.gz` makes); anything else after a member is an
// error, not ignored. Tracks the offset in the (decompressed) stream for error messages. The
// readers of model/data/ share it.
//
// Thread-compatible: one thread at a time.
class InputFile {
 public:
  // NOT_FOUND / PERMISSION_DENIED etc. (from errno) if `path` cannot be opened.
  static absl::StatusOr<std::unique_ptr<InputFile>> Open(const std::string& path);

  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  bool gzipped() const { return zs_ != nullptr; }
  // Bytes read so far (decompressed bytes for a gzip file).
  int64_t offset() const { return offset_; }

  // "offset N", marked as decompressed for gzip files.
  std::string Where(int64_t offset) const;

  // Reads up to `size` bytes into `buffer`; fewer only where the data ends (0 at the end).
  // Advances offset(). Errors: the errno of a failed read; INVALID_ARGUMENT for a corrupt gzip
  // stream or bytes after a gzip member that do not start another, naming the file and the
  // offset.
  absl::StatusOr<size_t> Read(unsigned char* buffer, size_t size);

  // Appended to a truncation message: " (the gzip stream is cut short)" if the gzip stream
  // ended before its trailer, otherwise "".
  const char* TruncationNote() const;
  // True once a read has found the gzip stream ending before its trailer.
  bool gzip_cut_short() const { return gzip_cut_short_; }

  // Reads exactly `size` bytes of `what`; if the data ends first, INVALID_ARGUMENT saying
  // where, against `expected_end`, the offset at which the file should end.
  absl::Status ReadExactly(unsigned char* buffer, size_t size, const char* what,
                           int64_t expected_end);

  // OK if nothing follows the current offset and a gzip stream is whole; otherwise
  // INVALID_ARGUMENT saying that data follows where `layout` should end, or that the gzip
  // stream lacks its trailer.
  absl::Status ExpectEnd(const std::string& layout);

 private:
  InputFile(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}

  // Reads compressed bytes into in_ when it is empty; false at the end of the file.
  absl::StatusOr<bool> FillInput();
  absl::StatusOr<size_t> ReadGzip(unsigned char* buffer, size_t size);

  const std::string path_;
  std::FILE* const file_;  // Owned.
  // Gzip files: zlib's inflate state (owned; null for plain files), the compressed bytes read and
  // not yet inflated, how many compressed bytes were read in all, and whether the current member
  // has ended.
  z_stream_s* zs_ = nullptr;
  std::vector<unsigned char> in_;
  int64_t compressed_read_ = 0;
  bool member_ended_ = false;
  int64_t offset_ = 0;
  bool gzip_cut_short_ = false;  // The gzip stream ended without its trailer.
};

// The lines of a text file (plain or gzip, as InputFile), one at a time, for the line-based
// readers (Criteo, CSV). A line ends at '\n'; the '\n' and one '\r' before it are not part of
// it, so Windows line ends read as Unix ones. A last line without '\n' is a line; a file that
// ends with '\n' has no empty line after it.
//
// Thread-compatible: one thread at a time.
class LineReader {
 public:
  // Errors: those of InputFile::Open.
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  // The 1-based number of the line Next returned last (0 before the first).
  int64_t line_number() const { return line_number_; }

  // Stores the next line in *line and returns true; returns false at the end of the file.
  // Errors: those of InputFile::Read, and INVALID_ARGUMENT if a gzip stream is cut short
  // before its trailer (found at its end).
  absl::StatusOr<bool> Next(std::string* line);

 private:
  explicit LineReader(std::unique_ptr<InputFile> file);

  // Refills buffer_ from the file; false at its end.
  absl::StatusOr<bool> Fill();

  std::unique_ptr<InputFile> file_;
  std::vector<unsigned char> buffer_;
  size_t begin_ = 0;  // Unconsumed bytes of buffer_ are [begin_, end_).
  size_t end_ = 0;
  int64_t line_number_ = 0;
};

// The file a reader should open for `path`: `path` + ".gz" if that exists, otherwise `path`.
// Errors: NOT_FOUND naming both paths when neither exists; the errno of another failure to
// open one (e.g. PERMISSION_DENIED).
absl::StatusOr<std::string> FindGzipOrPlain(const std::string& path);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_INPUT_FILE_H_
