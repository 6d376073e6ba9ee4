// chief: the coordinator of a training cluster. Parses flags and runs ChiefServer.
#include <cstdio>
#include <string>

#include "chief/chief_server.h"
#include "common/daemon.h"
#include "common/daemon_flags.h"
#include "common/proto_file.h"
#include "gflags/gflags.h"

DEFINE_int32(heartbeat_interval_ms, 1000, "Tasks send a heartbeat this often, in milliseconds.");
DEFINE_int32(heartbeat_timeout_ms, 5000,
             "A task without a heartbeat for this long is reported MISSING, in milliseconds.");
DEFINE_string(model_spec, "",
              "The model's variables and tables: a pscluster.v1.ModelSpec in text format, or "
              "JSON when the name ends in .json. Empty: no variables.");
DEFINE_string(placement_strategy, "round_robin",
              "How variables are spread over ps tasks: round_robin (TF replica_device_setter) "
              "or greedy (by bytes, TF GreedyLoadBalancingStrategy).");
DEFINE_int64(max_partition_bytes, 0,
             "Variables larger than this are split along their first dimension into partitions "
             "of at most this many bytes. 0: never split.");
DEFINE_int32(num_virtual_shards, 1024, "Sparse keys hash into this many virtual shards.");

int main(int argc, char** argv) {
  pscluster::InitDaemonMain(
      "the chief of a parameter-server training cluster.\n"
      "The cluster comes from TF_CONFIG, --cluster_spec_file, or --chief_hosts/--ps_hosts/"
      "--worker_hosts with --job_name=chief --task_index=0.",
      &argc, &argv);
  pscluster::ChiefOptions options;
  options.cluster = pscluster::ClusterConfigFromFlagsOrExit("chief");
  options.host = pscluster::ServiceHostOptionsFromFlags();
  options.heartbeat_interval = absl::Milliseconds(FLAGS_heartbeat_interval_ms);
  options.heartbeat_timeout = absl::Milliseconds(FLAGS_heartbeat_timeout_ms);
  if (!FLAGS_model_spec.empty()) {
    absl::Status read = pscluster::ReadProtoFile(FLAGS_model_spec, &options.model);
    if (!read.ok()) {
      std::fprintf(stderr, "chief: --model_spec: %s\n", std::string(read.message()).c_str());
      return 2;
    }
  }
  if (FLAGS_placement_strategy == "round_robin") {
    options.placement.set_strategy(pscluster::v1::PlacementOptions::ROUND_ROBIN);
  } else if (FLAGS_placement_strategy == "greedy") {
    options.placement.set_strategy(pscluster::v1::PlacementOptions::GREEDY_BYTES);
  } else {
    std::fprintf(stderr,
                 "chief: --placement_strategy must be round_robin or greedy, not \"%s\"\n",
                 FLAGS_placement_strategy.c_str());
    return 2;
  }
  options.placement.set_max_partition_bytes(FLAGS_max_partition_bytes);
  options.placement.set_num_virtual_shards(FLAGS_num_virtual_shards);
  return pscluster::RunDaemonMain("chief", pscluster::ChiefServer::Create(options));
}
