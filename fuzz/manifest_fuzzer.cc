// Fuzzes the checkpoint manifest reader (storage/checkpoint.h, ParseManifest: the bytes of a
// MANIFEST.json). Input: the file's bytes.
// Invariants: a refused manifest is DATA_LOSS naming the file; an accepted one prints back to
// JSON (as CommitManifest writes it) that parses to the same message.
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/coordinator_service.pb.h"
#include "storage/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pscluster;
  const std::string path = "ckpt-0000000001/MANIFEST.json";
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<v1::CheckpointManifest> manifest = ParseManifest(json, path);
  if (!manifest.ok()) {
    FUZZ_CHECK(manifest.status().code() == absl::StatusCode::kDataLoss &&
                   absl::StrContains(manifest.status().message(), path),
               manifest.status().ToString());
    return 0;
  }
  std::string printed;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  FUZZ_CHECK(google::protobuf::util::MessageToJsonString(*manifest, &printed, options).ok(),
             "an accepted manifest does not print: ", manifest->ShortDebugString());
  absl::StatusOr<v1::CheckpointManifest> again = ParseManifest(printed, path);
  FUZZ_CHECK(again.ok(), "the printed manifest does not parse: ", again.status().ToString(), "\n",
             printed);
  // Equivalent, not Equals: JSON writes a float -0.0 as "-0", which parses back as 0, an unset
  // proto3 field of the same value (found by this fuzzer in CI:
  // fuzz/regressions/manifest_fuzzer/negative_zero_float).
  FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equivalent(*manifest, *again),
             "the manifest changed in a print/parse round trip:\n", printed);
  return 0;
}
