#ifndef PSCLUSTER_COMMON_PROTO_FILE_H_
#define PSCLUSTER_COMMON_PROTO_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace pscluster {

// Reads a message from a file: JSON (protobuf's JSON mapping) when the name ends in ".json",
// text format otherwise. INVALID_ARGUMENT naming the file and the parser's complaint; NOT_FOUND
// when the file cannot be read.
absl::Status ReadProtoFile(const std::string& path, google::protobuf::Message* message);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_PROTO_FILE_H_
