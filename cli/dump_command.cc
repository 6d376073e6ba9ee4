#include "cli/dump_command.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/npy_writer.h"
#include "cli/table.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace pscluster {
namespace {

std::vector<int64_t> ShapeOf(const v1::VariableSpec& spec) {
  return std::vector<int64_t>(spec.shape().dims().begin(), spec.shape().dims().end());
}

// "dense/kernel" -> "dense__kernel"; unique within `taken`.
std::string FileNameFor(const std::string& variable, std::set<std::string>* taken) {
  std::string base;
  for (char c : variable) {
    if (c == '/') {
      base += "__";
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') {
      base += c;
    } else {
      base += '_';
    }
  }
  if (base.empty() || base[0] == '.') base = "_" + base;
  std::string name = base + ".npy";
  for (int i = 2; taken->count(name) > 0; ++i) name = absl::StrCat(base, "-", i, ".npy");
  taken->insert(name);
  return name;
}

absl::Status DumpOne(DenseVariableSource& source, const v1::VariableSpec& spec,
                     const std::string& path, psctl::DumpedVariable* out) {
  absl::StatusOr<std::vector<float>> values = source.Read(spec.name());
  if (!values.ok()) return values.status();
  const std::vector<int64_t> shape = ShapeOf(spec);
  absl::Status written =
      WriteNpyFile(path, shape, values->data(), static_cast<int64_t>(values->size()));
  if (!written.ok()) return written;
  out->set_name(spec.name());
  out->set_file(path);
  out->mutable_shape()->Add(shape.begin(), shape.end());
  out->set_dtype("float32");
  out->set_bytes(static_cast<int64_t>(values->size() * sizeof(float)));
  return absl::OkStatus();
}

}  // namespace

CommandOutput RunDumpCommand(DenseVariableSource& source, const std::string& variable,
                             const std::string& out_path, OutputFormat format) {
  CommandOutput out;
  absl::StatusOr<const v1::VariableSpec*> spec = FindDenseVariable(source.model(), variable);
  if (!spec.ok()) {
    out.status = spec.status();
    return out;
  }
  psctl::DumpReport report;
  report.set_source(source.Describe());
  out.status = DumpOne(source, **spec, out_path, report.add_variables());
  if (!out.status.ok()) return out;
  out.text = format == OutputFormat::kJson ? ReportToJson(report) : FormatDumpReport(report);
  return out;
}

absl::Status ExportVariablesToNpy(const std::string& dir, DenseVariableSource& source,
                                  psctl::DumpReport* report) {
  psctl::DumpReport local;
  if (report == nullptr) report = &local;
  report->set_source(source.Describe());
  report->set_dir(dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", dir, ": ", ec.message()));
  }
  std::vector<absl::Status> errors;
  std::set<std::string> taken = {"index.json"};
  google::protobuf::Struct index;
  for (const v1::VariableSpec& spec : source.model().variables()) {
    const std::string file = FileNameFor(spec.name(), &taken);
    psctl::DumpedVariable dumped;
    absl::Status s = DumpOne(source, spec, absl::StrCat(dir, "/", file), &dumped);
    if (!s.ok()) {
      errors.push_back(s);
      continue;
    }
    dumped.set_file(file);
    google::protobuf::Struct entry;
    (*entry.mutable_fields())["file"].set_string_value(file);
    (*entry.mutable_fields())["dtype"].set_string_value(dumped.dtype());
    google::protobuf::ListValue* shape = (*entry.mutable_fields())["shape"].mutable_list_value();
    for (int64_t d : dumped.shape()) shape->add_values()->set_number_value(d);
    *(*index.mutable_fields())[spec.name()].mutable_struct_value() = std::move(entry);
    *report->add_variables() = std::move(dumped);
  }
  for (const v1::TableSpec& t : source.model().tables()) report->add_skipped_tables(t.name());

  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(index, &json, options);
  json += '\n';
  const std::string index_path = absl::StrCat(dir, "/index.json");
  std::ofstream f(index_path + ".tmp", std::ios::trunc);
  f << json;
  f.close();
  if (!f || std::rename((index_path + ".tmp").c_str(), index_path.c_str()) != 0) {
    errors.push_back(absl::UnknownError(absl::StrCat("cannot write ", index_path)));
  }
  return MergeErrors(errors);
}

CommandOutput RunExportCommand(DenseVariableSource& source, const std::string& dir,
                               OutputFormat format) {
  CommandOutput out;
  psctl::DumpReport report;
  out.status = ExportVariablesToNpy(dir, source, &report);
  out.text = format == OutputFormat::kJson ? ReportToJson(report) : FormatDumpReport(report);
  return out;
}

std::string FormatDumpReport(const psctl::DumpReport& report) {
  TextTable table({"VARIABLE", "SHAPE", "DTYPE", "BYTES", "FILE"});
  for (const psctl::DumpedVariable& v : report.variables()) {
    v1::TensorShape shape;
    shape.mutable_dims()->CopyFrom(v.shape());
    table.AddRow({v.name(), ShapeString(shape), v.dtype(), HumanBytes(v.bytes()), v.file()});
  }
  std::string out = absl::StrCat("from ", report.source(), "\n", table.ToString());
  if (!report.dir().empty()) absl::StrAppend(&out, "index: ", report.dir(), "/index.json\n");
  if (report.skipped_tables_size() > 0) {
    absl::StrAppend(&out, "tables not dumped: ", absl::StrJoin(report.skipped_tables(), ", "),
                    "\n");
  }
  return out;
}

}  // namespace pscluster
