#include "model/data/input_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pscluster {
namespace {

constexpr size_t kChunkBytes = 1 << 20;
constexpr unsigned char kGzipMagic0 = 0x1f, kGzipMagic1 = 0x8b;
constexpr size_t kLineBufferBytes = 1 << 16;

}  // namespace

absl::StatusOr<std::unique_ptr<InputFile>> InputFile::Open(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  unsigned char magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, file);
  const bool gzipped = got == 2 && magic[0] == kGzipMagic0 && magic[1] == kGzipMagic1;
  std::rewind(file);
  std::unique_ptr<InputFile> input(new InputFile(path, file));
  if (gzipped) {
    input->zs_ = new z_stream{};
    // 16 + MAX_WBITS: a gzip wrapper, not zlib's own.
    if (inflateInit2(input->zs_, 16 + MAX_WBITS) != Z_OK) {
      delete input->zs_;
      input->zs_ = nullptr;
      return absl::ResourceExhaustedError(absl::StrCat("cannot start inflating ", path));
    }
  }
  return input;
}

InputFile::~InputFile() {
  if (file_ != nullptr) std::fclose(file_);
  if (zs_ != nullptr) {
    inflateEnd(zs_);
    delete zs_;
  }
}

std::string InputFile::Where(int64_t offset) const {
  return absl::StrCat("offset ", offset, gzipped() ? " (decompressed)" : "");
}

absl::StatusOr<size_t> InputFile::Read(unsigned char* buffer, size_t size) {
  if (zs_ != nullptr) return ReadGzip(buffer, size);
  const size_t total = std::fread(buffer, 1, size, file_);
  if (total < size && std::ferror(file_)) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat(path_, ": read error at ", Where(offset_ + total)));
  }
  offset_ += static_cast<int64_t>(total);
  return total;
}

absl::StatusOr<bool> InputFile::FillInput() {
  if (zs_->avail_in > 0) return true;
  in_.resize(kChunkBytes);
  const size_t got = std::fread(in_.data(), 1, in_.size(), file_);
  if (got == 0 && std::ferror(file_)) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat(path_, ": read error after ", compressed_read_, " compressed bytes"));
  }
  compressed_read_ += static_cast<int64_t>(got);
  zs_->next_in = in_.data();
  zs_->avail_in = static_cast<unsigned>(got);
  return got > 0;
}

absl::StatusOr<size_t> InputFile::ReadGzip(unsigned char* buffer, size_t size) {
  size_t total = 0;
  while (total < size) {
    PS_ASSIGN_OR_RETURN(const bool more, FillInput());
    if (!more) {
      // The file ends: after a whole member, the data does; inside one, it is cut short (the
      // bytes inflated so far are still returned).
      gzip_cut_short_ = !member_ended_;
      break;
    }
    if (member_ended_) {
      // Another member may follow; anything else is not gzip data.
      if (zs_->next_in[0] != kGzipMagic0 || (zs_->avail_in > 1 && zs_->next_in[1] != kGzipMagic1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path_, ": ", compressed_read_ - zs_->avail_in,
                         " compressed bytes in, after the gzip data that ends at ",
                         Where(offset_ + total), ", come bytes that are not another gzip member"));
      }
      inflateReset(zs_);
      member_ended_ = false;
    }
    zs_->next_out = buffer + total;
    zs_->avail_out = static_cast<unsigned>(std::min<size_t>(size - total, kChunkBytes));
    const unsigned before = zs_->avail_out;
    const int rc = inflate(zs_, Z_NO_FLUSH);
    total += before - zs_->avail_out;
    if (rc == Z_STREAM_END) {
      member_ended_ = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": corrupt gzip stream at ",
                                                     Where(offset_ + total), ": ",
                                                     zs_->msg != nullptr ? zs_->msg : zError(rc)));
    }
  }
  offset_ += static_cast<int64_t>(total);
  return total;
}

const char* InputFile::TruncationNote() const {
  return gzip_cut_short_ ? " (the gzip stream is cut short)" : "";
}

absl::Status InputFile::ReadExactly(unsigned char* buffer, size_t size, const char* what,
                                    int64_t expected_end) {
  PS_ASSIGN_OR_RETURN(const size_t got, Read(buffer, size));
  if (got < size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": truncated ", what, ": the file ends at ", Where(offset_),
                     " of expected ", expected_end, " bytes", TruncationNote()));
  }
  return absl::OkStatus();
}

absl::Status InputFile::ExpectEnd(const std::string& layout) {
  unsigned char extra;
  const int64_t end = offset_;
  PS_ASSIGN_OR_RETURN(const size_t got, Read(&extra, 1));
  if (got != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": unexpected data after ", Where(end), ", where ", layout, " end"));
  }
  if (gzip_cut_short_) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": truncated gzip stream: it is cut short after ", Where(end),
                     ", before its trailer (the data is complete but its checksum is missing)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> file, InputFile::Open(path));
  return std::unique_ptr<LineReader>(new LineReader(std::move(file)));
}

LineReader::LineReader(std::unique_ptr<InputFile> file)
    : file_(std::move(file)), buffer_(kLineBufferBytes) {}

absl::StatusOr<bool> LineReader::Fill() {
  begin_ = 0;
  PS_ASSIGN_OR_RETURN(end_, file_->Read(buffer_.data(), buffer_.size()));
  if (end_ > 0) return true;
  if (file_->gzip_cut_short()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file_->path(), ": truncated gzip stream: it is cut short after ",
        file_->Where(file_->offset()), " (line ", line_number_ + 1, "), before its trailer"));
  }
  return false;
}

absl::StatusOr<bool> LineReader::Next(std::string* line) {
  line->clear();
  bool any = false;  // Whether the line has begun (a byte or a '\n' was seen).
  while (true) {
    if (begin_ == end_) {
      PS_ASSIGN_OR_RETURN(const bool more, Fill());
      if (!more) break;
    }
    const unsigned char* start = buffer_.data() + begin_;
    const void* newline = std::memchr(start, '\n', end_ - begin_);
    any = true;
    if (newline == nullptr) {
      line->append(reinterpret_cast<const char*>(start), end_ - begin_);
      begin_ = end_;
      continue;
    }
    const size_t length = static_cast<const unsigned char*>(newline) - start;
    line->append(reinterpret_cast<const char*>(start), length);
    begin_ += length + 1;
    if (!line->empty() && line->back() == '\r') line->pop_back();
    ++line_number_;
    return true;
  }
  if (!any) return false;
  if (!line->empty() && line->back() == '\r') line->pop_back();
  ++line_number_;
  return true;
}

absl::StatusOr<std::string> FindGzipOrPlain(const std::string& path) {
  for (const std::string& candidate : {path + ".gz", path}) {
    std::FILE* file = std::fopen(candidate.c_str(), "rb");
    if (file != nullptr) {
      std::fclose(file);
      return candidate;
    }
    if (errno != ENOENT) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", candidate));
    }
  }
  return absl::NotFoundError(absl::StrCat("neither ", path, ".gz nor ", path, " exists"));
}

}  // namespace pscluster
