#ifndef PSCLUSTER_CHIEF_CHIEF_METRICS_H_
#define PSCLUSTER_CHIEF_CHIEF_METRICS_H_

#include <vector>

#include "chief/coordinator.h"
#include "prometheus/metric_family.h"

namespace pscluster {

// The chief's series, read from its coordinator at scrape time (runtime/metrics.h): the
// global step, rate, loss and test accuracy, each worker's steps, staleness, the tasks by job
// and health, the phase, recoveries, and the newest checkpoint's step, size, write time and
// age (from its manifest).
std::vector<prometheus::MetricFamily> ChiefMetricFamilies(const Coordinator& core);

// Part of ChiefMetricFamilies: the rebuilds of backups in `status` (replication 2), one series
// per ps task rebuilt: pscluster_backup_rebuild_state{ps,state} (1 for its state: copying,
// done, dropping), pscluster_backup_rebuild_primaries{ps} (to back up),
// pscluster_backup_rebuild_primaries_done{ps} and pscluster_backup_rebuild_bytes{ps}. None
// without rebuilds.
std::vector<prometheus::MetricFamily> RebuildMetricFamilies(const v1::ClusterStatus& status);

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_CHIEF_METRICS_H_
