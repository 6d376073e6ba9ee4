#include "cli/ckpt_command.h"

#include <filesystem>
#include <map>
#include <memory>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cli/checkpoint_source.h"
#include "cli/table.h"
#include "storage/checkpoint.h"

namespace pscluster {
namespace {

std::string Time(int64_t unix_micros) {
  if (unix_micros <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(unix_micros),
                          absl::LocalTimeZone());
}

std::string ShardLabel(const v1::SavedShard& s) {
  return s.is_table() ? s.name() : absl::StrCat(s.name(), "/", s.partition());
}

psctl::CheckpointSummary Summarize(const std::string& path) {
  psctl::CheckpointSummary out;
  out.set_path(path);
  absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(path);
  if (!m.ok()) {
    out.set_error(std::string(m.status().message()));
    return out;
  }
  out.set_step(m->step());
  out.set_created_unix_micros(m->created_unix_micros());
  out.set_num_ps(m->num_ps());
  out.set_shards(m->shards_size());
  out.set_bytes(m->bytes());
  *out.mutable_chain() = m->chain();
  return out;
}

// "full", or "delta <n> on <the full checkpoint>" for the n-th incremental one after it.
std::string Kind(const google::protobuf::RepeatedPtrField<std::string>& chain) {
  if (chain.empty()) return "full";
  return absl::StrCat("delta ", chain.size(), " on ", chain[0]);
}

std::string FormatList(const psctl::CheckpointListReport& report) {
  TextTable table({"CHECKPOINT", "STEP", "CREATED", "PS", "SHARDS", "BYTES", "KIND"});
  for (const psctl::CheckpointSummary& c : report.checkpoints()) {
    if (!c.error().empty()) {
      table.AddRow({c.path(), "?", "?", "?", "?", "?", "?"});
      continue;
    }
    table.AddRow({c.path(), absl::StrCat(c.step()), Time(c.created_unix_micros()),
                  absl::StrCat(c.num_ps()), absl::StrCat(c.shards()), HumanBytes(c.bytes()),
                  Kind(c.chain())});
  }
  if (report.checkpoints_size() == 0) {
    return absl::StrCat("no committed checkpoint in ", report.dir(), "\n");
  }
  return table.ToString();
}

std::string FormatManifest(const std::string& path, const v1::CheckpointManifest& m) {
  std::string out = absl::StrCat("checkpoint ", path, "\nstep ", m.step(), ", created ",
                                 Time(m.created_unix_micros()), ", ", m.num_ps(), " ps tasks, ",
                                 HumanBytes(m.bytes()), ", written in ",
                                 absl::FormatDuration(absl::Microseconds(m.write_micros())), "\n");
  if (!m.chain().empty()) {
    absl::StrAppend(&out, "incremental: builds on ", absl::StrJoin(m.chain(), ", "), " (",
                    m.chain(0), " full); its tables hold the rows changed since ",
                    m.chain(m.chain_size() - 1), " and the keys removed\n");
  }
  if (m.model().variables_size() > 0) {
    TextTable vars({"VARIABLE", "SHAPE", "DTYPE", "OPTIMIZER"});
    for (const v1::VariableSpec& v : m.model().variables()) {
      vars.AddRow({v.name(), ShapeString(v.shape()), DtypeName(v.dtype()),
                   OptimizerDescription(v.optimizer())});
    }
    absl::StrAppend(&out, "\n", vars.ToString());
  }
  if (m.model().tables_size() > 0) {
    TextTable tables({"TABLE", "DIM", "OPTIMIZER"});
    for (const v1::TableSpec& t : m.model().tables()) {
      tables.AddRow({t.name(), absl::StrCat(t.dim()), OptimizerDescription(t.optimizer())});
    }
    absl::StrAppend(&out, "\n", tables.ToString());
  }
  TextTable shards({"SHARD", "ROWS", "FILE", "BYTES", "CHECKSUM"});
  for (const v1::SavedShard& s : m.shards()) {
    const std::string rows =
        !s.is_table() ? absl::StrCat("[", s.dense().partition().row_begin(), ", ",
                                     s.dense().partition().row_end(), ")")
        : s.delta()   ? absl::StrCat(s.rows(), " changed, ", s.removed_keys(), " removed")
                      : absl::StrCat(s.rows());
    shards.AddRow({ShardLabel(s), rows, s.file(), HumanBytes(s.bytes()),
                   absl::StrFormat("%08x", s.checksum())});
  }
  absl::StrAppend(&out, "\n", shards.ToString());
  return out;
}

std::string FormatVerify(const psctl::CheckpointVerifyReport& report) {
  // An incremental checkpoint's shards are listed with those of the chain, each with its
  // checkpoint.
  const bool chain = !report.chain().empty();
  std::vector<std::string> header = {"SHARD", "FILE", "CHECKSUM", "RESULT"};
  if (chain) header.insert(header.begin(), "CHECKPOINT");
  TextTable table(header);
  for (const psctl::ShardCheck& c : report.shards()) {
    std::vector<std::string> row = {
        c.is_table() ? c.name() : absl::StrCat(c.name(), "/", c.partition()), c.file(),
        absl::StrFormat("%08x", c.checksum()), c.ok() ? "ok" : c.error()};
    if (chain) row.insert(row.begin(), c.checkpoint());
    table.AddRow(row);
  }
  return absl::StrCat(
      "checkpoint ", report.path(), " (step ", report.step(), ")\n",
      chain ? absl::StrCat("incremental: verified with ", absl::StrJoin(report.chain(), ", "), "\n")
            : "",
      table.ToString(), report.ok(), " shards ok, ", report.failed(), " failed\n");
}

}  // namespace

CommandOutput RunCheckpointListCommand(const std::string& dir, OutputFormat format) {
  CommandOutput out;
  psctl::CheckpointListReport report;
  report.set_dir(dir);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    out.status = absl::NotFoundError(absl::StrCat("no such directory: ", dir));
    return out;
  }
  absl::StatusOr<std::vector<std::string>> list = ListCheckpoints(dir);
  if (!list.ok()) {
    out.status = list.status();
    return out;
  }
  // A checkpoint named directly is listed alone.
  if (list->empty() && ReadManifest(dir).status().code() != absl::StatusCode::kNotFound) {
    list->push_back(dir);
  }
  std::vector<absl::Status> errors;
  for (const std::string& path : *list) {
    psctl::CheckpointSummary summary = Summarize(path);
    if (!summary.error().empty()) errors.push_back(absl::DataLossError(summary.error()));
    *report.add_checkpoints() = std::move(summary);
  }
  out.status = MergeErrors(errors);
  out.text = format == OutputFormat::kJson ? ReportToJson(report) : FormatList(report);
  return out;
}

CommandOutput RunCheckpointShowCommand(const std::string& path, OutputFormat format) {
  CommandOutput out;
  absl::StatusOr<std::string> resolved = ResolveCheckpointPath(path);
  if (!resolved.ok()) {
    out.status = resolved.status();
    return out;
  }
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(*resolved);
  if (!manifest.ok()) {
    out.status = manifest.status();
    return out;
  }
  psctl::CheckpointShowReport report;
  report.set_path(*resolved);
  *report.mutable_manifest() = *manifest;
  out.text =
      format == OutputFormat::kJson ? ReportToJson(report) : FormatManifest(*resolved, *manifest);
  return out;
}

psctl::CheckpointVerifyReport VerifyCheckpointShards(const std::string& path,
                                                     absl::Status* status) {
  psctl::CheckpointVerifyReport report;
  absl::StatusOr<std::string> resolved = ResolveCheckpointPath(path);
  if (!resolved.ok()) {
    *status = resolved.status();
    return report;
  }
  report.set_path(*resolved);
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(*resolved);
  if (!manifest.ok()) {
    *status = manifest.status();
    return report;
  }
  report.set_step(manifest->step());
  *report.mutable_chain() = manifest->chain();
  // The checkpoints an incremental one builds on, then itself.
  std::vector<std::string> links;
  const std::string dir = std::filesystem::path(*resolved).parent_path().string();
  for (const std::string& name : manifest->chain()) links.push_back(absl::StrCat(dir, "/", name));
  links.push_back(*resolved);
  std::map<std::string, absl::StatusOr<std::unique_ptr<CheckpointReader>>> readers;
  std::vector<absl::Status> errors;
  for (const std::string& link : links) {
    const std::string name = std::filesystem::path(link).filename().string();
    absl::StatusOr<v1::CheckpointManifest> m = link == *resolved ? *manifest : ReadManifest(link);
    if (!m.ok()) {
      psctl::ShardCheck* check = report.add_shards();
      check->set_checkpoint(name);
      check->set_name("MANIFEST.json");
      check->set_error(std::string(m.status().message()));
      errors.push_back(WithContext(m.status(), name));
      continue;
    }
    for (const v1::SavedShard& saved : m->shards()) {
      psctl::ShardCheck* check = report.add_shards();
      check->set_checkpoint(name);
      check->set_name(saved.name());
      check->set_partition(saved.partition());
      check->set_is_table(saved.is_table());
      check->set_file(saved.file());
      check->set_checksum(saved.checksum());
      check->set_bytes(saved.bytes());
      check->set_delta(saved.delta());
      check->set_removed_keys(saved.removed_keys());
      const std::string file = absl::StrCat(link, "/", saved.file());
      auto it = readers.find(file);
      if (it == readers.end()) it = readers.emplace(file, CheckpointReader::Open(file)).first;
      absl::Status s = it->second.status();
      if (s.ok() && saved.is_table()) {
        int64_t rows = 0;
        s = (*it->second)->ReadTable(saved, [&rows](int64_t, const float*, int64_t) { ++rows; });
        if (s.ok() && rows != saved.rows()) {
          s = absl::DataLossError(absl::StrCat("table ", saved.name(), " in ", saved.file(),
                                               " has ", rows, " rows, the manifest says ",
                                               saved.rows()));
        }
        if (s.ok()) s = (*it->second)->ReadTableRemoved(saved).status();
      } else if (s.ok()) {
        s = (*it->second)->ReadDense(saved).status();
      }
      check->set_ok(s.ok());
      if (!s.ok()) {
        check->set_error(std::string(s.message()));
        errors.push_back(WithContext(s, ShardLabel(saved)));
      }
    }
  }
  int failed = 0;
  for (const psctl::ShardCheck& c : report.shards()) failed += c.ok() ? 0 : 1;
  report.set_failed(failed);
  report.set_ok(report.shards_size() - failed);
  // The storage layer's own check may look at more than the shards listed (it is the one the
  // system restores through); a problem only it sees still fails verification.
  if (errors.empty()) errors.push_back(VerifyCheckpoint(*resolved));
  *status = MergeErrors(errors);
  return report;
}

CommandOutput RunCheckpointVerifyCommand(const std::string& path, OutputFormat format) {
  CommandOutput out;
  psctl::CheckpointVerifyReport report = VerifyCheckpointShards(path, &out.status);
  if (report.path().empty()) return out;
  out.text = format == OutputFormat::kJson ? ReportToJson(report) : FormatVerify(report);
  return out;
}

}  // namespace pscluster
