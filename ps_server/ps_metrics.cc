#include "ps_server/ps_metrics.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/metrics.h"

namespace pscluster {

std::vector<prometheus::MetricFamily> PsMetricFamilies(const ParameterStore& store,
                                                       const BackupStores* backups) {
  using prometheus::MetricType;
  const v1::ListShardsResponse shards = store.ListShards();
  struct Sums {
    double bytes = 0, pushes = 0, pulls = 0, in = 0, out = 0;
  };
  std::map<std::string, Sums> by_variable;
  FamilyBuilder rows("pscluster_ps_table_rows", "Rows of each embedding table on this ps task",
                     MetricType::Gauge);
  FamilyBuilder churn("pscluster_ps_table_row_events_total",
                      "Embedding-table rows admitted (created), evicted (capacity), expired (TTL), "
                      "and pushed keys not admitted, on this ps task",
                      MetricType::Counter);
  for (const v1::ShardStats& s : shards.shards()) {
    if (s.is_table()) {
      churn
          .Add(static_cast<double>(s.admitted_rows()), {{"table", s.name()}, {"event", "admitted"}})
          .Add(static_cast<double>(s.evicted_rows()), {{"table", s.name()}, {"event", "evicted"}})
          .Add(static_cast<double>(s.expired_rows()), {{"table", s.name()}, {"event", "expired"}})
          .Add(static_cast<double>(s.unadmitted_keys()),
               {{"table", s.name()}, {"event", "not_admitted"}});
    }
  }
  for (const v1::ShardStats& s : shards.shards()) {
    Sums& sum = by_variable[s.name()];
    sum.bytes += static_cast<double>(s.bytes());
    sum.pushes += static_cast<double>(s.pushes());
    sum.pulls += static_cast<double>(s.pulls());
    sum.in += static_cast<double>(s.bytes_in());
    sum.out += static_cast<double>(s.bytes_out());
    if (s.is_table()) rows.Add(static_cast<double>(s.rows()), {{"table", s.name()}});
  }
  FamilyBuilder bytes("pscluster_ps_variable_bytes",
                      "Bytes of each variable's shards on this ps task, optimizer slots included",
                      MetricType::Gauge);
  FamilyBuilder pushes("pscluster_ps_pushes_total", "Gradient pushes received, by variable",
                       MetricType::Counter);
  FamilyBuilder pulls("pscluster_ps_pulls_total", "Pulls served, by variable", MetricType::Counter);
  FamilyBuilder in("pscluster_ps_received_bytes_total", "Gradient bytes received, by variable",
                   MetricType::Counter);
  FamilyBuilder out("pscluster_ps_sent_bytes_total", "Parameter bytes sent, by variable",
                    MetricType::Counter);
  for (const auto& [name, sum] : by_variable) {
    bytes.Add(sum.bytes, {{"variable", name}});
    pushes.Add(sum.pushes, {{"variable", name}});
    pulls.Add(sum.pulls, {{"variable", name}});
    in.Add(sum.in, {{"variable", name}});
    out.Add(sum.out, {{"variable", name}});
  }
  FamilyBuilder dropped("pscluster_ps_dropped_stale_gradients_total",
                        "Sync mode: gradients dropped as stale or duplicate, by worker",
                        MetricType::Counter);
  for (const auto& [worker, count] : shards.dropped_by_worker()) {
    dropped.Add(static_cast<double>(count), {{"worker", absl::StrCat(worker)}});
  }
  const ParameterStore::ApplyTotals t = store.apply_totals();
  FamilyBuilder applies("pscluster_ps_applies_total",
                        "Optimizer updates applied (dense: per shard; sparse: per push or step)",
                        MetricType::Counter);
  applies.Add(static_cast<double>(t.dense_applies), {{"kind", "dense"}})
      .Add(static_cast<double>(t.sparse_applies), {{"kind", "sparse"}});
  FamilyBuilder apply_seconds("pscluster_ps_apply_seconds_total",
                              "Time spent applying optimizer updates", MetricType::Counter);
  apply_seconds.Add(static_cast<double>(t.dense_nanos) * 1e-9, {{"kind", "dense"}})
      .Add(static_cast<double>(t.sparse_nanos) * 1e-9, {{"kind", "sparse"}});

  std::vector<prometheus::MetricFamily> families;
  for (FamilyBuilder* b :
       {&bytes, &pushes, &pulls, &in, &out, &rows, &churn, &dropped, &applies, &apply_seconds}) {
    families.push_back(std::move(*b).Build());
  }
  if (backups == nullptr) return families;

  const ParameterStore::ForwardTotals f = store.forward_totals();
  FamilyBuilder forwards("pscluster_ps_forwards_total",
                         "Replication: this task's updates forwarded to their backups, by "
                         "outcome (acknowledged; failed, the push answered UNAVAILABLE; sent "
                         "while the push arrived but sent again after its apply)",
                         MetricType::Counter);
  forwards.Add(static_cast<double>(f.acknowledged), {{"outcome", "acknowledged"}})
      .Add(static_cast<double>(f.failed), {{"outcome", "failed"}})
      .Add(static_cast<double>(f.streams_fell_back), {{"outcome", "stream_fell_back"}});
  FamilyBuilder early("pscluster_ps_forwards_committed_early_total",
                      "Replication: of the acknowledged, pushes streamed to their backups whose "
                      "commit went out before this task's own apply (the backups applying them "
                      "meanwhile)",
                      MetricType::Counter);
  early.Add(static_cast<double>(f.committed_early), {});
  FamilyBuilder owed("pscluster_ps_forwards_owed",
                     "Replication: pushes applied on this task whose forwards to a backup have "
                     "not gone through yet (what its backups lag behind by)",
                     MetricType::Gauge);
  owed.Add(static_cast<double>(f.owed), {});
  const ParameterStore::RebuildTotals r = store.rebuild_totals();
  FamilyBuilder rebuild_bytes(
      "pscluster_ps_rebuild_bytes_total",
      "Replication: bytes of the copies this task took of its shards for new backups (copied), "
      "sent so far (a copy on its way counts as it goes out), and not gone out when their copy "
      "failed (abandoned; a copy refused at its end counts as sent); copied - sent - abandoned "
      "is on its way now",
      MetricType::Counter);
  rebuild_bytes.Add(static_cast<double>(r.bytes_copied), {{"state", "copied"}})
      .Add(static_cast<double>(r.bytes_sent), {{"state", "sent"}})
      .Add(static_cast<double>(r.bytes_abandoned), {{"state", "abandoned"}});
  FamilyBuilder rebuild_copies("pscluster_ps_rebuild_copies_total",
                               "Replication: copies of this task's shards for new backups, by "
                               "outcome (sent: taken by the backup, also those a later failure "
                               "of the same rebuild gave up; failed)",
                               MetricType::Counter);
  rebuild_copies.Add(static_cast<double>(r.copies_sent), {{"outcome", "sent"}})
      .Add(static_cast<double>(r.copies_failed), {{"outcome", "failed"}});
  v1::ListShardsResponse held;
  backups->AppendShards(&held);
  std::map<std::pair<int, bool>, double> by_primary;
  for (const v1::ShardStats& s : held.shards()) {
    if (!s.is_table()) by_primary[{s.primary_ps_task(), s.promoted()}] += 1;
  }
  FamilyBuilder backup_shards("pscluster_ps_backup_shards",
                              "Replication: dense shards this task holds of other tasks, by "
                              "primary task and state (backup; promoted: served as the primary "
                              "since that task failed over)",
                              MetricType::Gauge);
  for (const auto& [key, count] : by_primary) {
    backup_shards.Add(count, {{"primary", absl::StrCat("ps:", key.first)},
                              {"state", key.second ? "promoted" : "backup"}});
  }
  // Dense shards: the updates each one applied, on its primary (those with a backup) and on the
  // task holding its backup; a backup lags its primary by the difference, shard by shard.
  FamilyBuilder shard_updates(
      "pscluster_ps_shard_updates",
      "Replication: updates applied to each dense shard this task serves that has a backup, by "
      "variable, partition and backup task (the backup's pscluster_ps_backup_shard_updates lags "
      "by what is still on its way)",
      MetricType::Gauge);
  for (const v1::ShardStats& s : shards.shards()) {
    if (s.is_table() || !s.has_backup_ps_task()) continue;
    shard_updates.Add(static_cast<double>(s.applied_step()),
                      {{"variable", s.name()},
                       {"partition", absl::StrCat(s.partition())},
                       {"backup", absl::StrCat("ps:", s.backup_ps_task())}});
  }
  FamilyBuilder backup_updates(
      "pscluster_ps_backup_shard_updates",
      "Replication: updates applied to each dense shard this task holds of another task, by "
      "variable, partition, primary task and state (backup; promoted: served as the primary "
      "since that task failed over)",
      MetricType::Gauge);
  for (const v1::ShardStats& s : held.shards()) {
    if (s.is_table()) continue;
    backup_updates.Add(static_cast<double>(s.applied_step()),
                       {{"variable", s.name()},
                        {"partition", absl::StrCat(s.partition())},
                        {"primary", absl::StrCat("ps:", s.primary_ps_task())},
                        {"state", s.promoted() ? "promoted" : "backup"}});
  }
  // Tables: groups of a push's rows numbered per (backup task, stripe) on the primary and applied
  // in that order on the backup (docs/replication.md): a backup lags its primary by the
  // difference of the two, per table.
  FamilyBuilder groups_forwarded(
      "pscluster_ps_table_groups_forwarded_total",
      "Replication: groups of table rows this task numbered for each backup task, by table "
      "and backup (their backup's pscluster_ps_table_groups_applied_total lags by what is "
      "still on its way)",
      MetricType::Counter);
  for (const v1::ShardStats& s : shards.shards()) {
    if (!s.is_table()) continue;
    for (const auto& [backup, sent] : s.table_groups_sent()) {
      groups_forwarded.Add(static_cast<double>(sent),
                           {{"table", s.name()}, {"backup", absl::StrCat("ps:", backup)}});
    }
  }
  FamilyBuilder groups_applied("pscluster_ps_table_groups_applied_total",
                               "Replication: groups of table rows this task applied as a backup, "
                               "by table and primary task",
                               MetricType::Counter);
  for (const v1::ShardStats& s : held.shards()) {
    if (!s.is_table()) continue;
    groups_applied.Add(
        static_cast<double>(s.table_groups_applied()),
        {{"table", s.name()}, {"primary", absl::StrCat("ps:", s.primary_ps_task())}});
  }
  for (FamilyBuilder* b :
       {&forwards, &early, &owed, &rebuild_bytes, &rebuild_copies, &backup_shards, &shard_updates,
        &backup_updates, &groups_forwarded, &groups_applied}) {
    families.push_back(std::move(*b).Build());
  }
  return families;
}

}  // namespace pscluster
