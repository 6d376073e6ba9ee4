#include "cli/npy_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
constexpr size_t kAlignment = 64;

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  const std::string message = absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::UnknownError(message);
  }
}

}  // namespace

std::string NpyHeader(const std::vector<int64_t>& shape) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string dict =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", dims, "), }");
  // magic (6) + version (2) + length (2) + dict + padding + '\n' is a multiple of 64.
  const size_t unpadded = kMagicBytes + 2 + 2 + dict.size() + 1;
  dict.append((kAlignment - unpadded % kAlignment) % kAlignment, ' ');
  dict += '\n';
  std::string out(kMagic, kMagicBytes);
  out += static_cast<char>(1);  // major version
  out += static_cast<char>(0);  // minor version
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>((dict.size() >> 8) & 0xff);
  out += dict;
  return out;
}

std::string EncodeNpy(const std::vector<int64_t>& shape, const float* data, int64_t n) {
  CHECK_EQ(n, NumElements(shape));
  std::string out = NpyHeader(shape);
  const size_t header = out.size();
  out.resize(header + static_cast<size_t>(n) * sizeof(float));
  char* dst = &out[header];
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &data[i], sizeof(bits));
    for (int b = 0; b < 4; ++b) dst[i * 4 + b] = static_cast<char>((bits >> (8 * b)) & 0xff);
  }
  return out;
}

absl::Status WriteNpyFile(const std::string& path, const std::vector<int64_t>& shape,
                          const float* data, int64_t n) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write ", path, ": negative dimension ", d));
    }
  }
  if (n != NumElements(shape)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", path, ": ", n,
                                                   " elements do not fill shape (",
                                                   absl::StrJoin(shape, ", "), ")"));
  }
  const std::string content = EncodeNpy(shape, data, n);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoStatus("create", tmp, errno);
  const bool written = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !written) {
    std::remove(tmp.c_str());
    return ErrnoStatus("write", tmp, written ? errno : write_errno);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return ErrnoStatus("rename to", path, err);
  }
  return absl::OkStatus();
}

}  // namespace pscluster
