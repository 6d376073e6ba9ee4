// chief: the coordinator of a training cluster. Parses flags and runs ChiefServer.
#include "chief/chief_server.h"
#include "common/daemon.h"
#include "common/daemon_flags.h"
#include "gflags/gflags.h"

DEFINE_int32(heartbeat_interval_ms, 1000, "Tasks send a heartbeat this often, in milliseconds.");
DEFINE_int32(heartbeat_timeout_ms, 5000,
             "A task without a heartbeat for this long is reported MISSING, in milliseconds.");

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
  return pscluster::RunDaemonMain("chief", pscluster::ChiefServer::Create(options));
}
