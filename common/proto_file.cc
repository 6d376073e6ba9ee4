#include "common/proto_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace pscluster {
namespace {

// Collects the text-format parser's complaints instead of letting it log them.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty())
      first_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

}  // namespace

absl::Status ReadProtoFile(const std::string& path, google::protobuf::Message* message) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (absl::EndsWith(path, ".json")) {
    auto s = google::protobuf::util::JsonStringToMessage(text, message);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " is not a valid ", message->GetTypeName(), " in JSON: ", s.message().ToString()));
    }
    return absl::OkStatus();
  }
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, message)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a valid ", message->GetTypeName(),
                                                   " in text format: ", errors.first()));
  }
  return absl::OkStatus();
}

}  // namespace pscluster
