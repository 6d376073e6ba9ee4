#include "cli/vars_command.h"

#include <future>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/table.h"
#include "sharding/placement.h"

namespace pscluster {
namespace {

using ShardKey = std::pair<std::string, int32_t>;  // (name, partition); -1 for a table

struct PsListing {
  absl::Status status;
  std::map<ShardKey, v1::ShardStats> shards;
  // The task's backups of other tasks' shards, by (primary task, shard).
  std::map<std::pair<int, ShardKey>, v1::ShardStats> backups;
};

std::vector<PsListing> ListEveryPs(LiveCluster& cluster) {
  std::vector<std::future<absl::StatusOr<v1::ListShardsResponse>>> pending;
  for (int ps = 0; ps < cluster.num_ps(); ++ps) {
    pending.push_back(std::async(std::launch::async, [&cluster, ps] {
      return cluster.client->ListShards(ps, /*include_backups=*/true);
    }));
  }
  std::vector<PsListing> out(pending.size());
  for (size_t ps = 0; ps < pending.size(); ++ps) {
    absl::StatusOr<v1::ListShardsResponse> list = pending[ps].get();
    if (!list.ok()) {
      out[ps].status = list.status();
      continue;
    }
    for (const v1::ShardStats& s : list->shards()) {
      const ShardKey key{s.name(), s.is_table() ? -1 : s.partition()};
      if (s.backup()) {
        out[ps].backups[{s.primary_ps_task(), key}] = s;
      } else {
        out[ps].shards[key] = s;
      }
    }
  }
  return out;
}

std::string StrategyName(v1::PlacementOptions::Strategy s) {
  switch (s) {
    case v1::PlacementOptions::ROUND_ROBIN:
      return "round_robin";
    case v1::PlacementOptions::GREEDY_BYTES:
      return "greedy_bytes";
    default:
      return absl::StrCat("strategy ", static_cast<int>(s));
  }
}

std::string Address(const LiveCluster& cluster, int ps) {
  return ps >= 0 && ps < cluster.model.ps_addresses_size() ? cluster.model.ps_addresses(ps) : "";
}

// A total that misses the parts that could not be read is a lower bound: ">= 6.0 KiB".
std::string AtLeast(const std::string& total, bool complete) {
  return complete ? total : ">= " + total;
}

}  // namespace

psctl::VarsReport BuildVarsReport(LiveCluster& cluster, absl::Status* status) {
  const v1::Placement& placement = cluster.model.placement();
  psctl::VarsReport report;
  report.set_num_ps(placement.num_ps());
  report.set_placement_version(placement.version());
  report.set_placement_strategy(StrategyName(placement.options().strategy()));
  report.set_max_partition_bytes(placement.options().max_partition_bytes());

  std::vector<PsListing> listings = ListEveryPs(cluster);
  std::vector<absl::Status> errors;
  for (int ps = 0; ps < static_cast<int>(listings.size()); ++ps) {
    psctl::PsTaskInfo* info = report.add_ps_tasks();
    info->set_index(ps);
    info->set_address(Address(cluster, ps));
    info->set_reachable(listings[ps].status.ok());
    if (!listings[ps].status.ok()) {
      info->set_error(std::string(listings[ps].status.message()));
      errors.push_back(listings[ps].status);
    }
    info->set_shards(static_cast<int32_t>(listings[ps].shards.size()));
    for (const auto& [key, s] : listings[ps].shards) info->set_bytes(info->bytes() + s.bytes());
    info->set_backup_shards(static_cast<int32_t>(listings[ps].backups.size()));
    for (const auto& [key, s] : listings[ps].backups) {
      info->set_backup_bytes(info->backup_bytes() + s.bytes());
    }
  }
  const std::vector<std::vector<int32_t>> owned = VirtualShardsByPs(placement);
  for (int ps = 0; ps < report.ps_tasks_size() && ps < static_cast<int>(owned.size()); ++ps) {
    report.mutable_ps_tasks(ps)->set_virtual_shards(static_cast<int32_t>(owned[ps].size()));
  }

  // Tasks the chief failed over (replication 2): their partitions are served by their backups.
  const std::set<int> failed(placement.failed_over_ps().begin(), placement.failed_over_ps().end());
  for (const v1::VariableSpec& spec : cluster.model.model().variables()) {
    psctl::VariableInfo* var = report.add_variables();
    var->set_name(spec.name());
    var->mutable_shape()->CopyFrom(spec.shape().dims());
    var->set_dtype(DtypeName(spec.dtype()));
    var->set_optimizer(OptimizerDescription(spec.optimizer()));
    absl::StatusOr<std::vector<const v1::DensePartition*>> parts =
        PartitionsOf(placement, spec.name());
    if (!parts.ok()) {
      errors.push_back(absl::FailedPreconditionError(
          absl::StrCat("the chief's placement has no partition of variable ", spec.name())));
      continue;
    }
    for (const v1::DensePartition* p : *parts) {
      psctl::PartitionInfo* info = var->add_partitions();
      info->set_partition(p->partition());
      info->set_row_begin(p->row_begin());
      info->set_row_end(p->row_end());
      info->set_ps_task(p->ps_task());
      info->set_ps_address(Address(cluster, p->ps_task()));
      if (failed.count(p->ps_task()) > 0) {
        // Served by the task that backed it up, from the store it took over.
        const int b = p->backup_ps_task();
        info->set_failed_over(true);
        info->set_failed_primary(p->ps_task());
        info->set_ps_task(b);
        info->set_ps_address(Address(cluster, b));
        if (b >= 0 && b < static_cast<int>(listings.size())) {
          auto it = listings[b].backups.find({p->ps_task(), {spec.name(), p->partition()}});
          if (it != listings[b].backups.end()) {
            info->set_held(true);
            info->set_bytes(it->second.bytes());
            info->set_updates(it->second.applied_step());
            var->set_bytes(var->bytes() + it->second.bytes());
          }
        }
        continue;
      }
      // A failed-over task holds the partition's backup again once the chief rebuilt it there:
      // the primary names it as the shard's backup.
      bool rebuilt = false;
      if (failed.count(p->backup_ps_task()) > 0 && p->ps_task() >= 0 &&
          p->ps_task() < static_cast<int>(listings.size())) {
        const auto& own = listings[p->ps_task()].shards;
        auto it = own.find({spec.name(), p->partition()});
        rebuilt = it != own.end() && it->second.has_backup_ps_task() &&
                  it->second.backup_ps_task() == p->backup_ps_task();
      }
      if (placement.options().replication() >= 2 && failed.count(p->backup_ps_task()) > 0 &&
          !rebuilt) {
        info->set_has_backup(true);
        info->set_backup_ps_task(p->backup_ps_task());
        info->set_backup_lost(true);
      } else if (placement.options().replication() >= 2) {
        info->set_has_backup(true);
        info->set_backup_ps_task(p->backup_ps_task());
        const int b = p->backup_ps_task();
        if (b >= 0 && b < static_cast<int>(listings.size())) {
          auto it = listings[b].backups.find({p->ps_task(), {spec.name(), p->partition()}});
          if (it != listings[b].backups.end()) {
            info->set_backup_held(true);
            info->set_backup_updates(it->second.applied_step());
          }
        }
      }
      if (p->ps_task() < 0 || p->ps_task() >= static_cast<int>(listings.size()) ||
          !listings[p->ps_task()].status.ok()) {
        continue;
      }
      const auto& held = listings[p->ps_task()].shards;
      auto it = held.find({spec.name(), p->partition()});
      if (it == held.end()) {
        errors.push_back(absl::FailedPreconditionError(
            absl::StrCat("the placement puts ", spec.name(), "/", p->partition(), " on ",
                         cluster.PsName(p->ps_task()), ", which does not hold it")));
        continue;
      }
      info->set_held(true);
      info->set_bytes(it->second.bytes());
      info->set_updates(it->second.applied_step());
      var->set_bytes(var->bytes() + it->second.bytes());
    }
  }

  for (const v1::TableSpec& spec : cluster.model.model().tables()) {
    psctl::TableInfo* table = report.add_tables();
    table->set_name(spec.name());
    table->set_dim(spec.dim());
    table->set_vocabulary_size(spec.vocabulary_size());
    table->set_optimizer(OptimizerDescription(spec.optimizer()));
    for (int ps = 0; ps < static_cast<int>(listings.size()); ++ps) {
      psctl::TablePart* part = table->add_parts();
      part->set_ps_task(ps);
      part->set_ps_address(Address(cluster, ps));
      part->set_reachable(listings[ps].status.ok());
      auto it = listings[ps].shards.find({spec.name(), -1});
      if (it == listings[ps].shards.end()) continue;
      part->set_rows(it->second.rows());
      part->set_bytes(it->second.bytes());
      part->set_pushes(it->second.pushes());
      part->set_pulls(it->second.pulls());
      for (const auto& [b, sent] : it->second.table_groups_sent()) {
        psctl::TableBackup* backup = part->add_backups();
        backup->set_ps_task(b);
        backup->set_groups_sent(sent);
        if (b < 0 || b >= static_cast<int>(listings.size())) continue;
        auto held = listings[b].backups.find({ps, {spec.name(), -1}});
        if (held == listings[b].backups.end()) continue;
        backup->set_held(true);
        backup->set_groups_applied(held->second.table_groups_applied());
      }
      table->set_rows(table->rows() + part->rows());
      table->set_bytes(table->bytes() + part->bytes());
    }
  }
  *status = MergeErrors(errors);
  return report;
}

namespace {

// How far a backup is behind its primary: "" when it is not known, ", in step", or ", 3
// updates behind".
std::string BehindBy(bool known, int64_t lag, const char* unit) {
  if (!known) return "";
  if (lag <= 0) return ", in step";
  return absl::StrCat(", ", lag, " ", unit, lag == 1 ? "" : "s", " behind");
}

}  // namespace

std::string FormatVarsReport(const psctl::VarsReport& report) {
  auto ps_name = [](int ps) { return absl::StrCat("ps:", ps); };
  std::string out;
  if (report.variables_size() > 0) {
    TextTable vars({"VARIABLE", "SHAPE", "DTYPE", "PARTITIONS", "BYTES", "OPTIMIZER"});
    bool replicated = false;
    for (const psctl::VariableInfo& v : report.variables()) {
      for (const psctl::PartitionInfo& p : v.partitions()) {
        replicated |= p.has_backup() || p.failed_over();
      }
    }
    std::vector<std::string> columns = {"PARTITION", "ROWS", "PS", "ADDRESS", "BYTES", "UPDATES"};
    if (replicated) columns.push_back("BACKUP");
    TextTable parts(columns);
    for (const psctl::VariableInfo& v : report.variables()) {
      v1::TensorShape shape;
      shape.mutable_dims()->CopyFrom(v.shape());
      bool complete = true;
      for (const psctl::PartitionInfo& p : v.partitions()) complete = complete && p.held();
      vars.AddRow({v.name(), ShapeString(shape), v.dtype(), absl::StrCat(v.partitions_size()),
                   AtLeast(HumanBytes(v.bytes()), complete), v.optimizer()});
      for (const psctl::PartitionInfo& p : v.partitions()) {
        std::vector<std::string> row = {
            absl::StrCat(v.name(), "/", p.partition()),
            absl::StrCat("[", p.row_begin(), ", ", p.row_end(), ")"),
            p.failed_over() ? absl::StrCat(ps_name(p.ps_task()), " (took over from ",
                                           ps_name(p.failed_primary()), ")")
                            : ps_name(p.ps_task()),
            p.ps_address(),
            p.held() ? HumanBytes(p.bytes()) : "?",
            p.held() ? absl::StrCat(p.updates()) : "?"};
        if (replicated) {
          row.push_back(
              p.failed_over()   ? absl::StrCat("- (lost with ", ps_name(p.failed_primary()), ")")
              : !p.has_backup() ? "-"
              : p.backup_lost() ? absl::StrCat(ps_name(p.backup_ps_task()), " (lost)")
              : p.backup_held()
                  ? absl::StrCat(ps_name(p.backup_ps_task()), " (", p.backup_updates(), " updates",
                                 BehindBy(p.held(), p.updates() - p.backup_updates(), "update"),
                                 ")")
                  : absl::StrCat(ps_name(p.backup_ps_task()), " (missing)"));
        }
        parts.AddRow(row);
      }
    }
    absl::StrAppend(&out, vars.ToString(), "\n", parts.ToString());
  }
  if (report.tables_size() > 0) {
    TextTable tables({"TABLE", "DIM", "KEYS", "ROWS", "BYTES", "OPTIMIZER"});
    bool table_backups = false;
    for (const psctl::TableInfo& t : report.tables()) {
      for (const psctl::TablePart& p : t.parts()) table_backups |= p.backups_size() > 0;
    }
    std::vector<std::string> part_columns = {"TABLE", "PS",     "ADDRESS", "ROWS",
                                             "BYTES", "PUSHES", "PULLS"};
    if (table_backups) part_columns.push_back("BACKUPS");
    TextTable parts(part_columns);
    for (const psctl::TableInfo& t : report.tables()) {
      bool complete = true;
      for (const psctl::TablePart& p : t.parts()) complete = complete && p.reachable();
      tables.AddRow(
          {t.name(), absl::StrCat(t.dim()),
           t.vocabulary_size() > 0 ? absl::StrCat("ids < ", t.vocabulary_size()) : "hashed",
           AtLeast(absl::StrCat(t.rows()), complete), AtLeast(HumanBytes(t.bytes()), complete),
           t.optimizer()});
      for (const psctl::TablePart& p : t.parts()) {
        std::vector<std::string> row = {t.name(),
                                        ps_name(p.ps_task()),
                                        p.ps_address(),
                                        p.reachable() ? absl::StrCat(p.rows()) : "?",
                                        p.reachable() ? HumanBytes(p.bytes()) : "?",
                                        p.reachable() ? absl::StrCat(p.pushes()) : "?",
                                        p.reachable() ? absl::StrCat(p.pulls()) : "?"};
        if (table_backups) {
          // Each backup task with its lag, in the stripe groups it has yet to apply.
          std::vector<std::string> backups;
          for (const psctl::TableBackup& b : p.backups()) {
            backups.push_back(
                b.held()
                    ? absl::StrCat(
                          ps_name(b.ps_task()), " (",
                          BehindBy(true, b.groups_sent() - b.groups_applied(), "group").substr(2),
                          ")")
                    : absl::StrCat(ps_name(b.ps_task()), " (missing)"));
          }
          row.push_back(backups.empty() ? "-" : absl::StrJoin(backups, ", "));
        }
        parts.AddRow(row);
      }
    }
    if (!out.empty()) out += "\n";
    absl::StrAppend(&out, tables.ToString(), "\n", parts.ToString());
  }
  // Backups held (issue 37) get a column of their own where any task holds one.
  bool backups = false;
  for (const psctl::PsTaskInfo& p : report.ps_tasks()) backups |= p.backup_shards() > 0;
  std::vector<std::string> columns = {"PS", "ADDRESS", "SHARDS", "BYTES", "VIRTUAL SHARDS"};
  if (backups) columns.push_back("BACKUPS");
  columns.push_back("STATUS");
  TextTable ps(columns);
  for (const psctl::PsTaskInfo& p : report.ps_tasks()) {
    std::vector<std::string> row = {
        ps_name(p.index()), p.address(), p.reachable() ? absl::StrCat(p.shards()) : "?",
        p.reachable() ? HumanBytes(p.bytes()) : "?", absl::StrCat(p.virtual_shards())};
    if (backups) {
      row.push_back(p.reachable()
                        ? absl::StrCat(p.backup_shards(), " (", HumanBytes(p.backup_bytes()), ")")
                        : "?");
    }
    row.push_back(p.reachable() ? "ok" : "unreachable");
    ps.AddRow(row);
  }
  if (!out.empty()) out += "\n";
  absl::StrAppend(&out, ps.ToString(), "\nplacement: ", report.placement_strategy(), ", ",
                  report.num_ps(), " ps tasks, max partition ",
                  report.max_partition_bytes() > 0 ? HumanBytes(report.max_partition_bytes())
                                                   : std::string("unlimited"),
                  ", version ", report.placement_version(), "\n");
  return out;
}

CommandOutput RunVarsCommand(LiveCluster& cluster, OutputFormat format) {
  CommandOutput out;
  psctl::VarsReport report = BuildVarsReport(cluster, &out.status);
  out.text = format == OutputFormat::kJson ? ReportToJson(report) : FormatVarsReport(report);
  return out;
}

}  // namespace pscluster
