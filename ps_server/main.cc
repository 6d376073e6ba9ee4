// ps_server: a parameter server task. Parses flags and runs PsServer.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/time/time.h"
#include "common/memory_limit.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "ps_server/ps_server.h"
#include "runtime/daemon.h"
#include "runtime/daemon_flags.h"
#include "storage/crash_points.h"

DEFINE_string(nan_policy, "refuse",
              "What to do with a gradient that holds NaN or Inf: refuse (INVALID_ARGUMENT, "
              "nothing applied) or allow.");
DEFINE_int64(pull_chunk_bytes, 1 << 20,
             "Chunk size of streamed dense pulls when the client does not choose, in bytes.");

DEFINE_bool(data_plane, true,
            "Serve pulls and pushes over the tensor data plane (plain TCP beside gRPC; see "
            "common/tensor_wire.h) as well as over gRPC.");
DEFINE_int32(data_port, 0,
             "Port of the tensor data plane (0: any free one; clients find it through "
             "GetStatus).");
DEFINE_bool(data_plane_kernel_tls, false,
            "With TLS: hand the tensor data plane's record encryption to the kernel (Linux "
            "kTLS) where the kernel and OpenSSL allow; otherwise OpenSSL encrypts in user "
            "space.");
DEFINE_int32(data_plane_idle_timeout_ms, 60000,
             "Tensor data plane: a connection with no request under way for this long is "
             "closed (clients open another when they need one).");
DEFINE_int32(data_plane_io_timeout_ms, 60000,
             "Tensor data plane: each read or write of a request, its header included, must "
             "finish within this once it has begun; otherwise the connection is closed.");
DEFINE_int32(data_plane_max_connections, 1024,
             "Tensor data plane: connections served at once; with that many open, a new one "
             "takes the place of the one idle longest.");
DEFINE_int32(apply_threads, -1,
             "Threads that apply large dense updates in parallel blocks, beside the calling "
             "one, and large sparse requests while the requests under way leave cores free "
             "(-1: one per core beyond the first, at most 7).");
DEFINE_int64(memory_budget_mb, -1,
             "Memory this ps task may give to dense shards and embedding tables (values and "
             "optimizer slots; a table row's index entry), its own and the backups it holds "
             "together (--replication=2 on the chief), in MiB: shards beyond it are refused, "
             "and so are pulls and pushes whose new table rows would pass it (-1: 90% of what the "
             "process may use, the machine's memory or its cgroup's cap, a pod's memory limit; "
             "0: no limit).");
DEFINE_double(give_up_on_chief_secs, 0,
              "Give up on a chief that has answered no registration or heartbeat for this many "
              "seconds: stop and exit 3 (its Job failed for good; the Kubernetes Jobs fail on "
              "exit 3). 0: wait for it for ever.");
DEFINE_int64(max_sparse_keys, 8 << 20, "Most keys in one sparse pull or push.");
DEFINE_int64(max_table_rows, 0,
             "Most rows one embedding table may hold on this ps task; pulls and pushes that "
             "would create more are refused (0: no limit). Tables with a capacity of their own "
             "(eviction.max_rows or max_bytes in the model config) evict instead.");

DEFINE_string(checkpoint_dir, "",
              "Path of the cluster's checkpoint directory (the chief's --checkpoint_dir, shared; "
              "it must exist): saves "
              "and restores name a checkpoint, resolved under it; a path a peer sends is not "
              "used. Required with TLS; without TLS and without it, the chief's paths are used "
              "as given.");
DEFINE_string(crash_at, "",
              "Tests only: die of SIGKILL at a point of the checkpoint write, \"<point>[@<n>]\" "
              "(the n-th time; see storage/crash_points.h).");

namespace {

// --memory_budget_mb, or 90% of what this process may use: the machine's memory, or its
// cgroup's cap (a pod's memory limit), so that a model too large for it is refused rather than
// OOM-killed.
int64_t MemoryBudgetBytes() {
  if (FLAGS_memory_budget_mb >= 0) return FLAGS_memory_budget_mb << 20;
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const pscluster::MemoryLimit limit =
      pscluster::ProcessMemoryLimit(pages > 0 && page > 0 ? pages * page : 0);
  const int64_t budget = limit.bytes / 10 * 9;
  LOG(INFO) << "ps_server: memory budget " << (budget >> 20) << " MiB, 90% of "
            << (limit.bytes >> 20) << " MiB (" << limit.source << "; --memory_budget_mb sets it)";
  return budget;
}

}  // namespace

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
  options.serve_data_plane = FLAGS_data_plane;
  options.data_plane.port = FLAGS_data_port;
  if (FLAGS_data_plane_idle_timeout_ms < 1 || FLAGS_data_plane_io_timeout_ms < 1 ||
      FLAGS_data_plane_max_connections < 1) {
    std::fprintf(stderr,
                 "ps_server: --data_plane_idle_timeout_ms, --data_plane_io_timeout_ms and "
                 "--data_plane_max_connections must be >= 1\n");
    return 2;
  }
  options.data_plane.idle_timeout = absl::Milliseconds(FLAGS_data_plane_idle_timeout_ms);
  options.data_plane.io_timeout = absl::Milliseconds(FLAGS_data_plane_io_timeout_ms);
  options.data_plane.max_connections = FLAGS_data_plane_max_connections;
  options.data_plane_kernel_tls = FLAGS_data_plane_kernel_tls;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  options.store.apply_threads =
      FLAGS_apply_threads >= 0 ? FLAGS_apply_threads : std::max(0, std::min(cores - 1, 7));
  options.store.memory_budget_bytes = MemoryBudgetBytes();
  if (FLAGS_max_sparse_keys < 1) {
    std::fprintf(stderr, "ps_server: --max_sparse_keys must be >= 1\n");
    return 2;
  }
  options.store.max_sparse_keys = FLAGS_max_sparse_keys;
  options.store.checkpoint_dir = FLAGS_checkpoint_dir;
  // The chief's directory, shared: it must be there (mounted), not made empty here, and this
  // task writes its shards into it.
  pscluster::CheckPathFlagOrExit("ps_server", "checkpoint_dir", FLAGS_checkpoint_dir,
                                 pscluster::PathKind::kWritableDirectory);
  if (FLAGS_max_table_rows < 0) {
    std::fprintf(stderr, "ps_server: --max_table_rows must be >= 0\n");
    return 2;
  }
  options.store.max_table_rows = FLAGS_max_table_rows;
  if (!(FLAGS_give_up_on_chief_secs >= 0)) {
    std::fprintf(stderr, "ps_server: --give_up_on_chief_secs must be >= 0, not %g\n",
                 FLAGS_give_up_on_chief_secs);
    return 2;
  }
  options.give_up_on_chief_after = FLAGS_give_up_on_chief_secs > 0
                                       ? absl::Seconds(FLAGS_give_up_on_chief_secs)
                                       : absl::InfiniteDuration();
  options.store.require_checkpoint_dir = options.host.tls.enabled();
  auto crash_points = pscluster::CrashPoints::Parse(FLAGS_crash_at);
  if (!crash_points.ok()) {
    std::fprintf(stderr, "ps_server: --crash_at: %s\n",
                 std::string(crash_points.status().message()).c_str());
    return 2;
  }
  options.store.crash_points = crash_points->get();
  // Outlives the daemon, whose collectors it calls.
  std::unique_ptr<pscluster::Metrics> metrics =
      pscluster::MetricsFromFlagsOrExit("ps_server", options.cluster);
  options.host.metrics = metrics.get();
  return pscluster::RunDaemonMain("ps_server", pscluster::PsServer::Create(options));
}
