// worker: a training worker. Parses flags and runs WorkerServer.
#include "common/daemon.h"
#include "common/daemon_flags.h"
#include "worker/worker_server.h"

int main(int argc, char** argv) {
  pscluster::InitDaemonMain(
      "a worker of a parameter-server training cluster.\n"
      "The cluster comes from TF_CONFIG, --cluster_spec_file, or --chief_hosts/--ps_hosts/"
      "--worker_hosts with --job_name=worker --task_index=N.",
      &argc, &argv);
  pscluster::WorkerOptions options;
  options.cluster = pscluster::ClusterConfigFromFlagsOrExit("worker");
  options.host = pscluster::ServiceHostOptionsFromFlags();
  return pscluster::RunDaemonMain("worker", pscluster::WorkerServer::Create(options));
}
