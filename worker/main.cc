// worker: a training worker. Parses flags and runs WorkerServer.
#include <cstdio>
#include <string>

#include "gflags/gflags.h"
#include "runtime/daemon.h"
#include "runtime/daemon_flags.h"
#include "worker/worker_server.h"

DEFINE_string(device, "cpu",
              "Where to compute: cpu, gpu:N, or several GPUs gpu:0,gpu:1,... that split each batch "
              "and sum their gradients with NCCL (CUDA_VISIBLE_DEVICES applies).");
DEFINE_int32(pipeline_staleness, 1,
             "ASYNC and SSP: how many of this worker's own steps' pushes the parameters of a step "
             "may miss, so that pulls and pushes overlap compute (0: none). SYNC uses 0.");
DEFINE_bool(cuda_graphs, true,
            "GPU: replay a step's kernels from a CUDA graph captured on its second run, where "
            "nothing inside the step waits for the ps (local steps, --local_steps on the chief); "
            "false launches them one by one.");
DEFINE_int64(gpu_memory_limit_mb, 0,
             "Cap on the GPU memory this worker allocates, in MiB (0: no cap).");
DEFINE_string(wire_dtype, "float32",
              "Encoding of gradients and pulled values on the wire: float32, float16 or "
              "bfloat16.");
DEFINE_string(data_path, "",
              "Path of the data on this host, instead of the one the chief names (a directory "
              "for fashion_mnist, a file for libsvm). Checked at start.");
DEFINE_string(ps_transport, "tensor_wire",
              "How pulls and pushes travel: tensor_wire (the ps tasks' TCP data plane, found "
              "through their gRPC service; gRPC where a ps has none) or grpc.");
DEFINE_bool(exit_after_training, false, "Exit 0 when training is done instead of idling.");
DEFINE_int32(step_delay_ms, 0,
             "Pause between computing each step's gradients and pushing them, in milliseconds "
             "(a straggler, for tests).");

DEFINE_double(give_up_on_chief_secs, 0,
              "Give up on a chief that has answered no registration or heartbeat for this many "
              "seconds: stop and exit 3 (its Job failed for good; the Kubernetes Jobs fail on "
              "exit 3). 0: wait for it for ever.");
DEFINE_double(report_every_secs, 2,
              "How often an async worker reports its steps to the chief (sync and SSP workers "
              "report every step): the chief's global step, its progress and an evaluator's "
              "--eval_every_steps see the steps this late. The first step is reported at once.");

int main(int argc, char** argv) {
  pscluster::InitDaemonMain(
      "a worker of a parameter-server training cluster.\n"
      "The cluster comes from TF_CONFIG, --cluster_spec_file, or --chief_hosts/--ps_hosts/"
      "--worker_hosts with --job_name=worker --task_index=N.",
      &argc, &argv);
  pscluster::WorkerOptions options;
  options.cluster = pscluster::ClusterConfigFromFlagsOrExit("worker");
  options.host = pscluster::ServiceHostOptionsFromFlags();
  options.device = FLAGS_device;
  options.pipeline_staleness = FLAGS_pipeline_staleness;
  options.cuda_graphs = FLAGS_cuda_graphs;
  options.gpu_memory_limit_bytes = FLAGS_gpu_memory_limit_mb << 20;
  if (FLAGS_wire_dtype == "float32") {
    options.wire_dtype = pscluster::v1::DT_FLOAT32;
  } else if (FLAGS_wire_dtype == "float16") {
    options.wire_dtype = pscluster::v1::DT_FLOAT16;
  } else if (FLAGS_wire_dtype == "bfloat16") {
    options.wire_dtype = pscluster::v1::DT_BFLOAT16;
  } else {
    std::fprintf(stderr, "worker: --wire_dtype must be float32, float16 or bfloat16, not \"%s\"\n",
                 FLAGS_wire_dtype.c_str());
    return 2;
  }
  options.data_path = FLAGS_data_path;
  pscluster::CheckPathFlagOrExit("worker", "data_path", FLAGS_data_path,
                                 pscluster::PathKind::kExisting);
  if (FLAGS_ps_transport != "tensor_wire" && FLAGS_ps_transport != "grpc") {
    std::fprintf(stderr, "worker: --ps_transport must be tensor_wire or grpc, not \"%s\"\n",
                 FLAGS_ps_transport.c_str());
    return 2;
  }
  options.tensor_wire = FLAGS_ps_transport == "tensor_wire";
  options.exit_after_training = FLAGS_exit_after_training;
  options.step_delay = absl::Milliseconds(FLAGS_step_delay_ms);
  if (!(FLAGS_report_every_secs > 0 && FLAGS_report_every_secs <= 3600)) {
    std::fprintf(stderr, "worker: --report_every_secs must be in (0, 3600], not %g\n",
                 FLAGS_report_every_secs);
    return 2;
  }
  options.report_every = absl::Seconds(FLAGS_report_every_secs);
  if (!(FLAGS_give_up_on_chief_secs >= 0)) {
    std::fprintf(stderr, "worker: --give_up_on_chief_secs must be >= 0, not %g\n",
                 FLAGS_give_up_on_chief_secs);
    return 2;
  }
  options.give_up_on_chief_after = FLAGS_give_up_on_chief_secs > 0
                                       ? absl::Seconds(FLAGS_give_up_on_chief_secs)
                                       : absl::InfiniteDuration();
  // Outlives the daemon, whose collectors it calls.
  std::unique_ptr<pscluster::Metrics> metrics =
      pscluster::MetricsFromFlagsOrExit("worker", options.cluster);
  options.host.metrics = metrics.get();
  return pscluster::RunDaemonMain("worker", pscluster::WorkerServer::Create(options));
}
