// evaluator: the evaluator task. Parses flags and runs EvaluatorServer.
#include <cstdio>

#include "evaluator/evaluator_server.h"
#include "gflags/gflags.h"
#include "runtime/daemon.h"
#include "runtime/daemon_flags.h"

DEFINE_double(eval_every_secs, 15, "Evaluate the live model this often while training.");
DEFINE_int64(eval_every_steps, 0,
             "Instead, when > 0: evaluate whenever the global step has moved this many steps "
             "(half an epoch's, say, for time to accuracy; each evaluation's log line and report "
             "name the training time its model was read at).");
DEFINE_string(data_path, "",
              "Path of the data on this host, instead of the one the chief names (a directory "
              "for fashion_mnist, a file for libsvm). Checked at start.");
DEFINE_string(ps_transport, "tensor_wire",
              "How pulls travel: tensor_wire (the ps tasks' TCP data plane) or grpc.");
DEFINE_bool(exit_after_training, false, "Exit 0 when training is over instead of idling.");
DEFINE_string(device, "cpu", "Where the forward passes run: cpu or gpu:N.");

int main(int argc, char** argv) {
  pscluster::InitDaemonMain(
      "the evaluator task of a parameter-server training cluster: evaluates the live model on "
      "the test set and reports to the chief.\n"
      "The cluster comes from TF_CONFIG (task type \"evaluator\", index 0) or --cluster_spec_file "
      "with --job_name=evaluator --task_index=0.",
      &argc, &argv);
  pscluster::EvaluatorOptions options;
  options.cluster = pscluster::ClusterConfigFromFlagsOrExit("evaluator");
  options.host = pscluster::ServiceHostOptionsFromFlags();
  options.eval_every = absl::Seconds(FLAGS_eval_every_secs);
  options.eval_every_steps = FLAGS_eval_every_steps;
  options.data_path = FLAGS_data_path;
  pscluster::CheckPathFlagOrExit("evaluator", "data_path", FLAGS_data_path,
                                 pscluster::PathKind::kExisting);
  if (FLAGS_ps_transport != "tensor_wire" && FLAGS_ps_transport != "grpc") {
    std::fprintf(stderr, "evaluator: --ps_transport must be tensor_wire or grpc, not \"%s\"\n",
                 FLAGS_ps_transport.c_str());
    return 2;
  }
  options.tensor_wire = FLAGS_ps_transport == "tensor_wire";
  options.exit_after_training = FLAGS_exit_after_training;
  options.device = FLAGS_device;
  // Outlives the daemon, whose collectors it calls.
  std::unique_ptr<pscluster::Metrics> metrics =
      pscluster::MetricsFromFlagsOrExit("evaluator", options.cluster);
  options.host.metrics = metrics.get();
  return pscluster::RunDaemonMain("evaluator", pscluster::EvaluatorServer::Create(options));
}
