#include "cli/npy_reader.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pscluster {
namespace {

// The text after "'key': " in a Python dict literal, up to the next top-level ", '" or "}".
absl::StatusOr<std::string> DictValue(const std::string& dict, const std::string& key) {
  const std::string needle = absl::StrCat("'", key, "': ");
  const size_t at = dict.find(needle);
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("npy header has no '", key, "': ", dict));
  }
  size_t end = at + needle.size();
  int depth = 0;
  for (; end < dict.size(); ++end) {
    const char c = dict[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  return dict.substr(at + needle.size(), end - at - needle.size());
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(const std::string& content) {
  if (content.size() < 10 || content.compare(0, 6, "\x93NUMPY") != 0) {
    return absl::InvalidArgumentError("not a .npy file: bad magic");
  }
  if (content[6] != 1 || content[7] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy version ", int{content[6]}, ".", int{content[7]}, ", expected 1.0"));
  }
  const size_t header_len = static_cast<unsigned char>(content[8]) |
                            (static_cast<size_t>(static_cast<unsigned char>(content[9])) << 8);
  if (content.size() < 10 + header_len) {
    return absl::InvalidArgumentError("npy header is longer than the file");
  }
  NpyArray out;
  out.header = content.substr(10, header_len);
  out.data_offset = 10 + header_len;
  if (out.header.empty() || out.header.back() != '\n') {
    return absl::InvalidArgumentError("npy header does not end in a newline");
  }
  absl::StatusOr<std::string> descr = DictValue(out.header, "descr");
  if (!descr.ok()) return descr.status();
  if (*descr != "'<f4'") {
    return absl::InvalidArgumentError(absl::StrCat("npy dtype ", *descr, ", expected '<f4'"));
  }
  absl::StatusOr<std::string> order = DictValue(out.header, "fortran_order");
  if (!order.ok()) return order.status();
  if (*order != "False") return absl::InvalidArgumentError("npy array is in Fortran order");
  absl::StatusOr<std::string> shape = DictValue(out.header, "shape");
  if (!shape.ok()) return shape.status();
  absl::string_view dims = *shape;
  if (!absl::ConsumePrefix(&dims, "(") || !absl::ConsumeSuffix(&dims, ")")) {
    return absl::InvalidArgumentError(absl::StrCat("npy shape ", *shape, " is not a tuple"));
  }
  // The element count, kept below what n * sizeof(float) can hold without overflowing.
  constexpr int64_t kMaxElements = std::numeric_limits<int64_t>::max() / sizeof(float);
  int64_t n = 1;
  for (absl::string_view d : absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t v;
    if (!absl::SimpleAtoi(d, &v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat("npy shape ", *shape, " has a bad size"));
    }
    out.shape.push_back(v);
    if (v != 0 && n > kMaxElements / v) {
      return absl::InvalidArgumentError(
          absl::StrCat("npy shape ", *shape, " has more than ", kMaxElements, " elements"));
    }
    n *= v;
  }
  if (content.size() - out.data_offset != static_cast<size_t>(n) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("npy data holds ",
                                                   content.size() - out.data_offset,
                                                   " bytes, shape ", *shape, " needs ", n * 4));
  }
  out.values.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b) {
      bits |=
          static_cast<uint32_t>(static_cast<unsigned char>(content[out.data_offset + i * 4 + b]))
          << (8 * b);
    }
    std::memcpy(&out.values[i], &bits, sizeof(bits));
  }
  return out;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseNpy(buffer.str());
}

}  // namespace pscluster
