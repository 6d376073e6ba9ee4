#include "cli/shard_command.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/table.h"
#include "sharding/placement.h"

namespace pscluster {
namespace {

const v1::VariableSpec* FindVariable(const v1::ModelSpec& model, absl::string_view name) {
  for (const v1::VariableSpec& v : model.variables()) {
    if (v.name() == name) return &v;
  }
  return nullptr;
}

const v1::TableSpec* FindTable(const v1::ModelSpec& model, absl::string_view name) {
  for (const v1::TableSpec& t : model.tables()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

std::string Names(const v1::ModelSpec& model) {
  std::vector<std::string> vars, tables;
  for (const v1::VariableSpec& v : model.variables()) vars.push_back(v.name());
  for (const v1::TableSpec& t : model.tables()) tables.push_back(t.name());
  std::string out = absl::StrCat("variables: ", vars.empty() ? "none" : absl::StrJoin(vars, ", "));
  if (!tables.empty()) absl::StrAppend(&out, "; tables: ", absl::StrJoin(tables, ", "));
  return out;
}

std::vector<float> FloatsOf(const std::string& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

std::vector<std::string> StatCells(const v1::ValueStats& s) {
  if (s.count() == 0) {
    return {"0", "-", "-", "-", "-", "-", absl::StrCat(s.nan_count()), absl::StrCat(s.inf_count())};
  }
  return {absl::StrCat(s.count()),     FormatStat(s.min()),        FormatStat(s.max()),
          FormatStat(s.mean()),        FormatStat(s.std()),        FormatStat(s.l2_norm()),
          absl::StrCat(s.nan_count()), absl::StrCat(s.inf_count())};
}

// Values, eight to a line, each line led by the index of its first element.
std::string FormatValues(int64_t offset, const google::protobuf::RepeatedField<float>& values) {
  std::string out;
  for (int i = 0; i < values.size(); i += 8) {
    absl::StrAppend(&out, "  [", offset + i, "]");
    for (int j = i; j < std::min(values.size(), i + 8); ++j) {
      absl::StrAppend(&out, " ", FormatStat(values.Get(j)));
    }
    out += "\n";
  }
  return out;
}

}  // namespace

absl::StatusOr<ShardName> ParseShardName(const v1::ModelSpec& model, absl::string_view arg) {
  if (FindVariable(model, arg) != nullptr) return ShardName{std::string(arg), -1};
  if (FindTable(model, arg) != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(arg, " is an embedding table, not a dense variable: use psctl table ", arg));
  }
  const size_t slash = arg.rfind('/');
  int32_t partition = 0;
  if (slash != absl::string_view::npos && absl::SimpleAtoi(arg.substr(slash + 1), &partition) &&
      partition >= 0 && FindVariable(model, arg.substr(0, slash)) != nullptr) {
    return ShardName{std::string(arg.substr(0, slash)), partition};
  }
  return absl::NotFoundError(absl::StrCat("unknown variable \"", arg, "\" (", Names(model), ")"));
}

psctl::ShardReport BuildShardReport(LiveCluster& cluster, absl::string_view shard,
                                    const ShardOptions& options, absl::Status* status) {
  psctl::ShardReport report;
  absl::StatusOr<ShardName> name = ParseShardName(cluster.model.model(), shard);
  if (!name.ok()) {
    *status = name.status();
    return report;
  }
  const v1::VariableSpec& spec = *FindVariable(cluster.model.model(), name->variable);
  report.set_variable(name->variable);
  report.mutable_shape()->CopyFrom(spec.shape().dims());
  absl::StatusOr<std::vector<const v1::DensePartition*>> parts =
      PartitionsOf(cluster.model.placement(), name->variable);
  if (!parts.ok()) {
    *status = parts.status();
    return report;
  }
  std::vector<const v1::DensePartition*> asked;
  for (const v1::DensePartition* p : *parts) {
    if (name->partition < 0 || p->partition() == name->partition) asked.push_back(p);
  }
  if (asked.empty()) {
    *status = absl::NotFoundError(absl::StrCat("variable ", name->variable, " has partitions 0..",
                                               parts->size() - 1, ", not ", name->partition));
    return report;
  }

  std::vector<std::future<absl::StatusOr<v1::InspectShardResponse>>> pending;
  for (const v1::DensePartition* p : asked) {
    v1::InspectShardRequest request;
    request.mutable_shard()->set_variable(name->variable);
    request.mutable_shard()->set_partition(p->partition());
    request.set_values_offset(options.values_count > 0 ? options.values_offset : 0);
    request.set_values_count(std::max<int64_t>(0, options.values_count));
    pending.push_back(std::async(std::launch::async, [&cluster, p, request] {
      return cluster.client->InspectShard(p->ps_task(), request);
    }));
  }
  std::vector<absl::Status> errors;
  bool first = true;
  for (size_t i = 0; i < asked.size(); ++i) {
    const v1::DensePartition& p = *asked[i];
    psctl::ShardInfo* info = report.add_shards();
    info->set_variable(name->variable);
    info->set_partition(p.partition());
    info->set_num_partitions(p.num_partitions());
    info->set_row_begin(p.row_begin());
    info->set_row_end(p.row_end());
    info->set_ps_task(p.ps_task());
    info->set_ps_address(p.ps_task() < cluster.model.ps_addresses_size()
                             ? cluster.model.ps_addresses(p.ps_task())
                             : "");
    absl::StatusOr<v1::InspectShardResponse> r = pending[i].get();
    if (!r.ok()) {
      info->set_error(std::string(r.status().message()));
      errors.push_back(r.status());
      continue;
    }
    info->mutable_shape()->CopyFrom(r->shard().shape().dims());
    info->set_bytes(r->shard().bytes());
    info->set_optimizer(OptimizerDescription(spec.optimizer()));
    info->set_updates(r->shard().applied_step());
    *info->mutable_stats() = r->values();
    if (options.values_count > 0) {
      info->set_values_offset(options.values_offset);
      for (float v : FloatsOf(r->slice())) info->add_values(v);
    }
    *report.mutable_total() = first ? r->values() : CombineValueStats(report.total(), r->values());
    first = false;
  }
  *status = MergeErrors(errors);
  return report;
}

std::string FormatShardReport(const psctl::ShardReport& report) {
  if (report.shards_size() == 0) return "";
  TextTable table({"SHARD", "ROWS", "PS", "COUNT", "MIN", "MAX", "MEAN", "STD", "L2 NORM", "NAN",
                   "INF", "UPDATES", "BYTES"});
  for (const psctl::ShardInfo& s : report.shards()) {
    std::vector<std::string> row = {absl::StrCat(s.variable(), "/", s.partition()),
                                    absl::StrCat("[", s.row_begin(), ", ", s.row_end(), ")"),
                                    absl::StrCat("ps:", s.ps_task())};
    if (!s.error().empty()) {
      for (int i = 0; i < 10; ++i) row.push_back("?");
    } else {
      for (std::string& c : StatCells(s.stats())) row.push_back(std::move(c));
      row.push_back(absl::StrCat(s.updates()));
      row.push_back(HumanBytes(s.bytes()));
    }
    table.AddRow(std::move(row));
  }
  if (report.shards_size() > 1) {
    bool all_read = true;
    for (const psctl::ShardInfo& s : report.shards()) all_read = all_read && s.error().empty();
    std::vector<std::string> row = {
        absl::StrCat(report.variable(), all_read ? " (all)" : " (readable shards)"), "", ""};
    for (std::string& c : StatCells(report.total())) row.push_back(std::move(c));
    row.push_back("");
    row.push_back("");
    table.AddRow(std::move(row));
  }
  v1::TensorShape shape;
  shape.mutable_dims()->CopyFrom(report.shape());
  const psctl::ShardInfo& any = report.shards(0);
  std::string out =
      absl::StrCat("variable ", report.variable(), " ", ShapeString(shape), ", ",
                   any.num_partitions(), " partition", any.num_partitions() == 1 ? "" : "s",
                   any.optimizer().empty() ? "" : ", " + any.optimizer(), "\n", table.ToString());
  for (const psctl::ShardInfo& s : report.shards()) {
    if (s.values_size() == 0) continue;
    absl::StrAppend(&out, "\nvalues of ", s.variable(), "/", s.partition(), " [", s.values_offset(),
                    ", ", s.values_offset() + s.values_size(), "):\n",
                    FormatValues(s.values_offset(), s.values()));
  }
  return out;
}

CommandOutput RunShardCommand(LiveCluster& cluster, absl::string_view shard,
                              const ShardOptions& options) {
  CommandOutput out;
  psctl::ShardReport report = BuildShardReport(cluster, shard, options, &out.status);
  if (report.shards_size() == 0) return out;  // nothing was read
  out.text =
      options.format == OutputFormat::kJson ? ReportToJson(report) : FormatShardReport(report);
  return out;
}

psctl::TableReport BuildTableReport(LiveCluster& cluster, absl::string_view table,
                                    const TableOptions& options, absl::Status* status) {
  psctl::TableReport report;
  const v1::ModelSpec& model = cluster.model.model();
  const v1::TableSpec* spec = FindTable(model, table);
  if (spec == nullptr) {
    *status = FindVariable(model, table) != nullptr
                  ? absl::InvalidArgumentError(absl::StrCat(
                        table, " is a dense variable, not a table: use psctl shard ", table))
                  : absl::NotFoundError(
                        absl::StrCat("unknown table \"", table, "\" (", Names(model), ")"));
    return report;
  }
  psctl::TableInfo* info = report.mutable_table();
  info->set_name(spec->name());
  info->set_dim(spec->dim());
  info->set_vocabulary_size(spec->vocabulary_size());
  info->set_optimizer(OptimizerDescription(spec->optimizer()));

  // Each key goes to the ps task that owns it, so a lookup never asks the wrong task.
  std::vector<std::vector<int64_t>> keys_of(cluster.num_ps());
  for (int64_t key : options.keys) {
    const int32_t ps = PsOfKey(cluster.model.placement(), key, spec->vocabulary_size());
    if (ps >= 0 && ps < cluster.num_ps()) keys_of[ps].push_back(key);
  }
  std::vector<std::future<absl::StatusOr<v1::InspectShardResponse>>> pending;
  for (int ps = 0; ps < cluster.num_ps(); ++ps) {
    v1::InspectShardRequest request;
    request.mutable_shard()->set_variable(spec->name());
    request.mutable_shard()->set_partition(-1);
    request.mutable_keys()->Add(keys_of[ps].begin(), keys_of[ps].end());
    pending.push_back(std::async(std::launch::async, [&cluster, ps, request] {
      return cluster.client->InspectShard(ps, request);
    }));
  }
  std::vector<absl::Status> errors;
  std::map<int64_t, psctl::TableRow> found;
  std::map<int64_t, int> missing;  // key -> ps task
  std::vector<v1::HotKey> hot;
  bool first = true;
  v1::ValueStats total;
  for (int ps = 0; ps < cluster.num_ps(); ++ps) {
    psctl::TablePart* part = info->add_parts();
    part->set_ps_task(ps);
    part->set_ps_address(ps < cluster.model.ps_addresses_size() ? cluster.model.ps_addresses(ps)
                                                                : "");
    absl::StatusOr<v1::InspectShardResponse> r = pending[ps].get();
    if (!r.ok()) {
      errors.push_back(r.status());
      continue;
    }
    part->set_reachable(true);
    part->set_rows(r->shard().rows());
    part->set_bytes(r->shard().bytes());
    part->set_pushes(r->shard().pushes());
    part->set_pulls(r->shard().pulls());
    part->set_admitted_rows(r->shard().admitted_rows());
    part->set_evicted_rows(r->shard().evicted_rows());
    part->set_expired_rows(r->shard().expired_rows());
    part->set_unadmitted_keys(r->shard().unadmitted_keys());
    *part->mutable_stats() = r->values();
    part->mutable_hot_keys()->CopyFrom(r->shard().hot_keys());
    hot.insert(hot.end(), r->shard().hot_keys().begin(), r->shard().hot_keys().end());
    info->set_rows(info->rows() + part->rows());
    info->set_bytes(info->bytes() + part->bytes());
    total = first ? r->values() : CombineValueStats(total, r->values());
    first = false;
    const std::vector<float> rows = FloatsOf(r->found_rows());
    const int64_t dim = spec->dim();
    for (int i = 0; i < r->found_keys_size(); ++i) {
      psctl::TableRow row;
      row.set_key(r->found_keys(i));
      row.set_ps_task(ps);
      if ((i + 1) * dim <= static_cast<int64_t>(rows.size())) {
        row.mutable_values()->Add(rows.begin() + i * dim, rows.begin() + (i + 1) * dim);
      }
      found[row.key()] = std::move(row);
    }
    for (int64_t key : r->missing_keys()) missing[key] = ps;
  }
  std::sort(hot.begin(), hot.end(), [](const v1::HotKey& a, const v1::HotKey& b) {
    return a.count() != b.count() ? a.count() > b.count() : a.key() < b.key();
  });
  for (size_t i = 0; i < hot.size() && static_cast<int>(i) < options.hot_keys; ++i) {
    *report.add_hot_keys() = hot[i];
  }
  // In the order asked, each key once.
  std::vector<std::string> not_found;
  std::map<int64_t, bool> seen;
  for (int64_t key : options.keys) {
    if (seen[key]) continue;
    seen[key] = true;
    auto f = found.find(key);
    if (f != found.end()) {
      *report.add_rows() = f->second;
    } else if (missing.count(key) > 0) {
      report.add_missing_keys(key);
      not_found.push_back(absl::StrCat(key, " (ps:", missing[key], ")"));
    }
  }
  if (!not_found.empty()) {
    errors.push_back(absl::NotFoundError(
        absl::StrCat("table ", spec->name(), " has no row for key ", absl::StrJoin(not_found, ", "),
                     "; rows exist once a worker touches them, and reading creates none")));
  }
  *status = MergeErrors(errors);
  return report;
}

std::string FormatTableReport(const psctl::TableReport& report) {
  const psctl::TableInfo& t = report.table();
  if (t.name().empty()) return "";
  std::string out =
      absl::StrCat("table ", t.name(), ": dim ", t.dim(), ", ",
                   t.vocabulary_size() > 0 ? absl::StrCat("ids < ", t.vocabulary_size(), ", ") : "",
                   t.rows(), " rows, ", HumanBytes(t.bytes()), ", ", t.optimizer(), "\n");
  TextTable parts({"PS", "ADDRESS", "ROWS", "BYTES", "PUSHES", "PULLS", "COUNT", "MIN", "MAX",
                   "MEAN", "STD", "L2 NORM", "NAN", "INF"});
  // Admission and eviction, in a table of their own.
  TextTable churn({"PS", "RESIDENT", "ADMITTED", "EVICTED", "EXPIRED", "NOT ADMITTED"});
  for (const psctl::TablePart& p : t.parts()) {
    std::vector<std::string> row = {absl::StrCat("ps:", p.ps_task()), p.ps_address()};
    std::vector<std::string> churn_row = {absl::StrCat("ps:", p.ps_task())};
    if (!p.reachable()) {
      for (int i = 0; i < 12; ++i) row.push_back("?");
      for (int i = 0; i < 5; ++i) churn_row.push_back("?");
    } else {
      row.push_back(absl::StrCat(p.rows()));
      row.push_back(HumanBytes(p.bytes()));
      row.push_back(absl::StrCat(p.pushes()));
      row.push_back(absl::StrCat(p.pulls()));
      for (std::string& c : StatCells(p.stats())) row.push_back(std::move(c));
      for (int64_t v :
           {p.rows(), p.admitted_rows(), p.evicted_rows(), p.expired_rows(), p.unadmitted_keys()}) {
        churn_row.push_back(absl::StrCat(v));
      }
    }
    parts.AddRow(std::move(row));
    churn.AddRow(std::move(churn_row));
  }
  out += parts.ToString();
  absl::StrAppend(&out, "\n", churn.ToString());
  if (report.hot_keys_size() > 0) {
    TextTable hot({"HOT KEY", "COUNT"});
    for (const v1::HotKey& h : report.hot_keys()) {
      hot.AddRow({absl::StrCat(h.key()), absl::StrCat(h.count())});
    }
    absl::StrAppend(&out, "\n", hot.ToString());
  }
  if (report.rows_size() > 0 || report.missing_keys_size() > 0) out += "\n";
  for (const psctl::TableRow& r : report.rows()) {
    std::vector<std::string> values;
    for (float v : r.values()) values.push_back(FormatStat(v));
    absl::StrAppend(&out, "key ", r.key(), " (ps:", r.ps_task(), "): ", absl::StrJoin(values, " "),
                    "\n");
  }
  for (int64_t key : report.missing_keys()) {
    absl::StrAppend(&out, "key ", key, ": no row\n");
  }
  return out;
}

CommandOutput RunTableCommand(LiveCluster& cluster, absl::string_view table,
                              const TableOptions& options) {
  CommandOutput out;
  psctl::TableReport report = BuildTableReport(cluster, table, options, &out.status);
  if (report.table().name().empty()) return out;  // nothing was read
  out.text =
      options.format == OutputFormat::kJson ? ReportToJson(report) : FormatTableReport(report);
  return out;
}

}  // namespace pscluster
