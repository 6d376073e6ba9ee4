#include "cli/command_output.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace pscluster {

std::string ReportToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing a valid message cannot fail; the status only reports unresolvable Any types.
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  if (out.empty() || out.back() != '\n') out += '\n';
  return out;
}

std::string HumanBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024 && unit + 1 < 5) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string DtypeName(v1::DataType dtype) {
  switch (dtype) {
    case v1::DT_INVALID:
    case v1::DT_FLOAT32:
      return "float32";
    case v1::DT_FLOAT16:
      return "float16";
    case v1::DT_BFLOAT16:
      return "bfloat16";
    case v1::DT_INT64:
      return "int64";
    default:
      return absl::StrCat("dtype ", static_cast<int>(dtype));
  }
}

namespace {

// "name=value, ..." for every scalar field of `message` that is set (proto3: not default).
std::string SetFields(const google::protobuf::Message& message) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  std::vector<std::string> parts;
  for (const google::protobuf::FieldDescriptor* f : fields) {
    using FD = google::protobuf::FieldDescriptor;
    switch (f->cpp_type()) {
      case FD::CPPTYPE_FLOAT:
        parts.push_back(absl::StrCat(f->name(), "=", reflection->GetFloat(message, f)));
        break;
      case FD::CPPTYPE_DOUBLE:
        parts.push_back(absl::StrCat(f->name(), "=", reflection->GetDouble(message, f)));
        break;
      case FD::CPPTYPE_INT64:
        parts.push_back(absl::StrCat(f->name(), "=", reflection->GetInt64(message, f)));
        break;
      case FD::CPPTYPE_INT32:
        parts.push_back(absl::StrCat(f->name(), "=", reflection->GetInt32(message, f)));
        break;
      case FD::CPPTYPE_BOOL:
        parts.push_back(absl::StrCat(f->name(), "=", reflection->GetBool(message, f)));
        break;
      default:
        break;
    }
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace

std::string OptimizerDescription(const v1::OptimizerSpec& optimizer) {
  const google::protobuf::OneofDescriptor* kind =
      v1::OptimizerSpec::descriptor()->FindOneofByName("kind");
  const google::protobuf::FieldDescriptor* field =
      optimizer.GetReflection()->GetOneofFieldDescriptor(optimizer, kind);
  if (field == nullptr) return "none";
  std::string out = absl::StrCat(
      field->name(), "(", SetFields(optimizer.GetReflection()->GetMessage(optimizer, field)), ")");
  if (optimizer.has_decay()) absl::StrAppend(&out, " decay(", SetFields(optimizer.decay()), ")");
  return out;
}

std::string FormatStat(double value) { return absl::StrFormat("%.6g", value); }

v1::ValueStats CombineValueStats(const v1::ValueStats& a, const v1::ValueStats& b) {
  v1::ValueStats out;
  out.set_nan_count(a.nan_count() + b.nan_count());
  out.set_inf_count(a.inf_count() + b.inf_count());
  const int64_t count = a.count() + b.count();
  out.set_count(count);
  if (count == 0) return out;
  if (a.count() == 0) {
    v1::ValueStats copy = b;
    copy.set_nan_count(out.nan_count());
    copy.set_inf_count(out.inf_count());
    return copy;
  }
  if (b.count() == 0) return CombineValueStats(b, a);
  out.set_min(std::min(a.min(), b.min()));
  out.set_max(std::max(a.max(), b.max()));
  const double sum = a.mean() * a.count() + b.mean() * b.count();
  const double sum_sq = a.l2_norm() * a.l2_norm() + b.l2_norm() * b.l2_norm();
  const double mean = sum / count;
  out.set_mean(mean);
  out.set_std(std::sqrt(std::max(0.0, sum_sq / count - mean * mean)));
  out.set_l2_norm(std::sqrt(sum_sq));
  return out;
}

absl::Status WithContext(const absl::Status& status, const std::string& context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

absl::Status MergeErrors(const std::vector<absl::Status>& errors) {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::vector<std::string> messages;
  for (const absl::Status& e : errors) {
    if (e.ok()) continue;
    if (code == absl::StatusCode::kOk) code = e.code();
    messages.emplace_back(e.message());
  }
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(code, absl::StrJoin(messages, "; "));
}

}  // namespace pscluster
