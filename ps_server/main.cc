// ps_server: a parameter server task. Parses flags and runs PsServer.
#include "common/daemon.h"
#include "common/daemon_flags.h"
#include "ps_server/ps_server.h"

int main(int argc, char** argv) {
  pscluster::InitDaemonMain(
      "a parameter server (ps task) of a training cluster.\n"
      "The cluster comes from TF_CONFIG, --cluster_spec_file, or --chief_hosts/--ps_hosts/"
      "--worker_hosts with --job_name=ps --task_index=N.",
      &argc, &argv);
  pscluster::PsServerOptions options;
  options.cluster = pscluster::ClusterConfigFromFlagsOrExit("ps_server");
  options.host = pscluster::ServiceHostOptionsFromFlags();
  return pscluster::RunDaemonMain("ps_server", pscluster::PsServer::Create(options));
}
