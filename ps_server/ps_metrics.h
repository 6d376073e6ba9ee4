#ifndef PSCLUSTER_PS_SERVER_PS_METRICS_H_
#define PSCLUSTER_PS_SERVER_PS_METRICS_H_

#include <vector>

#include "prometheus/metric_family.h"
#include "ps_server/backup_stores.h"
#include "ps_server/parameter_store.h"

namespace pscluster {

// A ps task's series, read from its store at scrape time (runtime/metrics.h): per variable
// (its partitions on this task summed) bytes with slots, pushes, pulls and bytes moved; rows
// per table; stale gradients dropped, per worker; optimizer applies and their time. With
// `backups` (replication 2, docs/replication.md): the forwards of the task's updates to their
// backups by outcome and those still owed, and the dense shards it holds as other tasks'
// backups, by primary and state (backup, or promoted since a failover).
std::vector<prometheus::MetricFamily> PsMetricFamilies(const ParameterStore& store,
                                                       const BackupStores* backups = nullptr);

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_PS_METRICS_H_
