// Fuzzes the .npy reader (cli/npy_reader.h, ParseNpy). Input: the file's bytes.
// Invariants: a refused file is INVALID_ARGUMENT; an accepted one has as many values as its
// shape's product, its data exactly fills the rest of the file, each value is the file's bits,
// and EncodeNpy (cli/npy_writer.h) of its shape and values parses back to the same array.
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_join.h"
#include "cli/npy_reader.h"
#include "cli/npy_writer.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pscluster;
  const std::string content(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<NpyArray> array = ParseNpy(content);
  if (!array.ok()) {
    FUZZ_CHECK(array.status().code() == absl::StatusCode::kInvalidArgument,
               array.status().ToString());
    return 0;
  }
  int64_t n = 1;
  for (int64_t d : array->shape) {
    FUZZ_CHECK(d >= 0, "dimension ", d);
    FUZZ_CHECK(!__builtin_mul_overflow(n, d, &n), "the accepted shape (",
               absl::StrJoin(array->shape, ", "), ") has more elements than an int64 holds");
  }
  FUZZ_CHECK(static_cast<int64_t>(array->values.size()) == n, array->values.size(),
             " values for shape (", absl::StrJoin(array->shape, ", "), ")");
  FUZZ_CHECK(array->data_offset + 4 * array->values.size() == content.size(), "data at ",
             array->data_offset, " with ", array->values.size(), " values in ", content.size(),
             " bytes");
  FUZZ_CHECK(array->values.empty() ||
                 std::memcmp(array->values.data(), content.data() + array->data_offset,
                             4 * array->values.size()) == 0,
             "values changed");
  const std::string encoded = EncodeNpy(array->shape, array->values.data(), n);
  absl::StatusOr<NpyArray> again = ParseNpy(encoded);
  FUZZ_CHECK(again.ok(), "EncodeNpy's file does not parse: ", again.status().ToString());
  FUZZ_CHECK(again->shape == array->shape, "shape (", absl::StrJoin(array->shape, ", "),
             ") came back as (", absl::StrJoin(again->shape, ", "), ")");
  FUZZ_CHECK(array->values.empty() || std::memcmp(again->values.data(), array->values.data(),
                                                  4 * array->values.size()) == 0,
             "values changed in a write/read round trip");
  return 0;
}
