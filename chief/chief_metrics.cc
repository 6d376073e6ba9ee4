#include "chief/chief_metrics.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/metrics.h"
#include "storage/checkpoint.h"

namespace pscluster {

std::vector<prometheus::MetricFamily> RebuildMetricFamilies(const v1::ClusterStatus& status) {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  if (status.rebuilds_size() == 0) return families;
  FamilyBuilder state("pscluster_backup_rebuild_state",
                      "1 for the state of the rebuild of backups onto each ps task failed over "
                      "that came back (copying, done, dropping: lost again)",
                      MetricType::Gauge);
  FamilyBuilder primaries("pscluster_backup_rebuild_primaries",
                          "Primaries whose partitions the task is to back up", MetricType::Gauge);
  FamilyBuilder done("pscluster_backup_rebuild_primaries_done",
                     "Of those, the primaries whose copies it holds", MetricType::Gauge);
  FamilyBuilder bytes("pscluster_backup_rebuild_bytes",
                      "Bytes copied onto the task since its rebuild began", MetricType::Gauge);
  FamilyBuilder rows("pscluster_backup_rebuild_rows",
                     "Table rows copied onto the task since its rebuild began (their bytes in "
                     "pscluster_backup_rebuild_bytes)",
                     MetricType::Gauge);
  for (const v1::BackupRebuild& r : status.rebuilds()) {
    const std::string ps = absl::StrCat(r.ps_task());
    std::string name = absl::AsciiStrToLower(v1::BackupRebuildState_Name(r.state()));
    if (absl::StartsWith(name, "backup_rebuild_")) name = name.substr(15);
    state.Add(1, {{"ps", ps}, {"state", name}});
    primaries.Add(r.primaries(), {{"ps", ps}});
    done.Add(r.primaries_done(), {{"ps", ps}});
    bytes.Add(static_cast<double>(r.bytes_copied()), {{"ps", ps}});
    rows.Add(static_cast<double>(r.rows_copied()), {{"ps", ps}});
  }
  families.push_back(std::move(state).Build());
  families.push_back(std::move(primaries).Build());
  families.push_back(std::move(done).Build());
  families.push_back(std::move(bytes).Build());
  families.push_back(std::move(rows).Build());
  return families;
}

std::vector<prometheus::MetricFamily> ChiefMetricFamilies(const Coordinator& core) {
  using prometheus::MetricType;
  v1::ClusterStatus status;
  core.GetClusterStatus(&status);
  const v1::TrainingProgress& p = status.progress();
  std::vector<prometheus::MetricFamily> families;
  auto one = [&families](const char* name, const char* help, MetricType type, double value) {
    families.push_back(FamilyBuilder(name, help, type).Add(value).Build());
  };
  one("pscluster_global_step", "The global step", MetricType::Counter,
      static_cast<double>(status.global_step()));
  one("pscluster_examples_per_second", "Training examples per second, all workers",
      MetricType::Gauge, p.examples_per_second());
  one("pscluster_training_loss", "Mean training loss over the recent steps", MetricType::Gauge,
      p.loss());
  one("pscluster_test_accuracy", "Latest test-set accuracy (-1 before the first evaluation)",
      MetricType::Gauge, p.test_accuracy());
  one("pscluster_epoch", "The epoch training is in", MetricType::Gauge, p.epoch());
  one("pscluster_workers_finished", "Workers done with training", MetricType::Gauge,
      p.workers_finished());
  one("pscluster_max_staleness",
      "Pipelined workers: the most of its own pushes a worker's parameters missed",
      MetricType::Gauge, p.max_staleness());
  one("pscluster_max_lead", "SSP: the largest lead granted over the slowest worker",
      MetricType::Gauge, static_cast<double>(p.max_lead()));
  one("pscluster_recoveries_total", "Recoveries begun (a ps task restarted)", MetricType::Counter,
      static_cast<double>(core.recoveries()));
  one("pscluster_failovers_total",
      "ps tasks failed over to their backups (--replication=2), restoring nothing",
      MetricType::Counter, static_cast<double>(core.FailedOver().size()));
  one("pscluster_training_finished", "1 once training is over", MetricType::Gauge,
      p.finished() ? 1 : 0);

  FamilyBuilder steps("pscluster_worker_steps_total", "Steps each worker has completed",
                      MetricType::Counter);
  for (int w = 0; w < p.worker_steps_size(); ++w) {
    steps.Add(static_cast<double>(p.worker_steps(w)), {{"worker", absl::StrCat(w)}});
  }
  families.push_back(std::move(steps).Build());

  std::map<std::pair<std::string, std::string>, int> tasks;
  for (const v1::TaskStatus& t : status.tasks()) {
    ++tasks[{t.task().job(), v1::TaskHealth_Name(t.health())}];
  }
  FamilyBuilder by_health("pscluster_tasks",
                          "Tasks of the cluster spec, by job (cluster_job: Prometheus keeps job "
                          "for the scrape job) and health",
                          MetricType::Gauge);
  for (const auto& [key, n] : tasks) {
    by_health.Add(n, {{"cluster_job", key.first}, {"health", key.second}});
  }
  families.push_back(std::move(by_health).Build());
  families.push_back(
      FamilyBuilder("pscluster_chief_phase", "1 for the chief's current phase", MetricType::Gauge)
          .Add(1, {{"phase", v1::ChiefPhase_Name(status.phase())}})
          .Build());

  for (prometheus::MetricFamily& f : RebuildMetricFamilies(status)) {
    families.push_back(std::move(f));
  }

  if (!status.last_checkpoint().empty()) {
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(status.last_checkpoint());
    if (m.ok()) {
      one("pscluster_checkpoint_step", "Global step of the newest checkpoint", MetricType::Gauge,
          static_cast<double>(m->step()));
      one("pscluster_checkpoint_bytes", "Size of the newest checkpoint", MetricType::Gauge,
          static_cast<double>(m->bytes()));
      one("pscluster_checkpoint_write_seconds", "How long the newest checkpoint took to write",
          MetricType::Gauge, static_cast<double>(m->write_micros()) * 1e-6);
      one("pscluster_checkpoint_age_seconds", "Time since the newest checkpoint was taken",
          MetricType::Gauge,
          absl::ToDoubleSeconds(absl::Now() - absl::FromUnixMicros(m->created_unix_micros())));
    }
  }
  return families;
}

}  // namespace pscluster
