// ps_server: a parameter server task. Parses flags and runs PsServer.
#include <cstdio>

#include "common/daemon.h"
#include "common/daemon_flags.h"
#include "gflags/gflags.h"
#include "ps_server/ps_server.h"
#include "storage/crash_points.h"

DEFINE_string(nan_policy, "refuse",
              "What to do with a gradient that holds NaN or Inf: refuse (INVALID_ARGUMENT, "
              "nothing applied) or allow.");
DEFINE_int64(pull_chunk_bytes, 1 << 20,
             "Chunk size of streamed dense pulls when the client does not choose, in bytes.");

DEFINE_string(crash_at, "",
              "Tests only: die of SIGKILL at a point of the checkpoint write, \"<point>[@<n>]\" "
              "(the n-th time; see storage/crash_points.h).");

int main(int argc, char** argv) {
  pscluster::InitDaemonMain(
      "a parameter server (ps task) of a training cluster.\n"
      "The cluster comes from TF_CONFIG, --cluster_spec_file, or --chief_hosts/--ps_hosts/"
      "--worker_hosts with --job_name=ps --task_index=N.",
      &argc, &argv);
  pscluster::PsServerOptions options;
  options.cluster = pscluster::ClusterConfigFromFlagsOrExit("ps_server");
  options.host = pscluster::ServiceHostOptionsFromFlags();
  if (FLAGS_nan_policy != "refuse" && FLAGS_nan_policy != "allow") {
    std::fprintf(stderr, "ps_server: --nan_policy must be refuse or allow, not \"%s\"\n",
                 FLAGS_nan_policy.c_str());
    return 2;
  }
  options.store.allow_non_finite = FLAGS_nan_policy == "allow";
  options.service.default_chunk_bytes = FLAGS_pull_chunk_bytes;
  auto crash_points = pscluster::CrashPoints::Parse(FLAGS_crash_at);
  if (!crash_points.ok()) {
    std::fprintf(stderr, "ps_server: --crash_at: %s\n",
                 std::string(crash_points.status().message()).c_str());
    return 2;
  }
  options.store.crash_points = crash_points->get();
  return pscluster::RunDaemonMain("ps_server", pscluster::PsServer::Create(options));
}
