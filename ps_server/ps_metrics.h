#ifndef PSCLUSTER_PS_SERVER_PS_METRICS_H_
#define PSCLUSTER_PS_SERVER_PS_METRICS_H_

#include <vector>

#include "prometheus/metric_family.h"
#include "ps_server/parameter_store.h"

namespace pscluster {

// A ps task's series, read from its store at scrape time (runtime/metrics.h): per variable
// (its partitions on this task summed) bytes with slots, pushes, pulls and bytes moved; rows
// per table; stale gradients dropped, per worker; optimizer applies and their time.
std::vector<prometheus::MetricFamily> PsMetricFamilies(const ParameterStore& store);

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_PS_METRICS_H_
