// chief: the coordinator of a training cluster. Parses flags and runs ChiefServer.
#include <cstdio>
#include <string>

#include "chief/chief_server.h"
#include "common/proto_file.h"
#include "gflags/gflags.h"
#include "model/input.h"
#include "runtime/daemon.h"
#include "runtime/daemon_flags.h"
#include "storage/crash_points.h"

DEFINE_int32(heartbeat_interval_ms, 1000, "Tasks send a heartbeat this often, in milliseconds.");
DEFINE_int32(heartbeat_timeout_ms, 5000,
             "A task without a heartbeat for this long is reported MISSING, in milliseconds.");
DEFINE_string(model_config, "",
              "Path of the model to train: a pscluster.v1.ModelConfig in text format (or JSON "
              "when the name ends in .json), e.g. configs/mlp.pbtxt.");
DEFINE_string(
    model_spec, "",
    "Instead of --model_config, a path: variables and tables only (pscluster.v1.ModelSpec), "
    "for a cluster that serves parameters without training.");
DEFINE_string(mode, "async", "async, sync (SyncReplicas) or ssp (bounded staleness).");
DEFINE_int32(replicas_to_aggregate, 0,
             "sync: gradients averaged per step; fewer than the workers makes the slowest "
             "ones backups. 0: every worker.");
DEFINE_int32(staleness, 2, "ssp: how many steps the fastest worker may run ahead of the slowest.");
DEFINE_int32(batch_size, 128, "Examples per worker per step.");
DEFINE_int32(epochs, 10, "Passes over each worker's shard of the data.");
DEFINE_int32(local_steps, 1,
             "async and ssp: each worker takes this many steps on its own copy of the dense "
             "variables and then pushes their change (GEO-SGD's local steps; docs/training.md). "
             "1: every step pushes its gradient.");
DEFINE_int64(max_steps, 0, "Stop each worker after this many steps (0: run the epochs).");
DEFINE_uint64(shuffle_seed, 1, "Seed of the per-epoch shuffle.");
DEFINE_string(data, "fashion_mnist",
              "fashion_mnist (idx files), cifar10 (CIFAR-10 binary version), libsvm, criteo "
              "(Criteo display-ads TSV), csv or synthetic_ctr (docs/data.md).");
DEFINE_string(data_path, "",
              "Path of the data: fashion_mnist: the idx files' directory (default "
              "/usr/share/datasets/fashion-mnist); cifar10: the directory of data_batch_1.bin "
              ".. data_batch_5.bin and test_batch.bin (plain or gzip); libsvm, criteo, csv: "
              "the training file "
              "(criteo and csv: plain or gzip). Checked at start.");
DEFINE_string(test_data_path, "", "libsvm, criteo, csv: path of the test file. Checked at start.");
DEFINE_int64(hash_buckets, 0,
             "criteo, csv: 0 makes each categorical value a 62-bit hashed id; N > 0 gives "
             "field f the ids [f*N, (f+1)*N).");
DEFINE_int32(criteo_int_columns, 13,
             "criteo: integer columns after the label (dense features, log(1 + max(x, 0))); "
             "must equal the model's input_dim.");
DEFINE_int32(criteo_cat_columns, 26, "criteo: categorical columns after the integer ones.");
DEFINE_string(csv_columns, "",
              "csv: the columns of a record, in order, comma-separated, each name:type "
              "(an empty field is an error) or name:type:default (an empty field takes the "
              "default; everything after the second ':'). Types: float and int (dense "
              "features, as many as the model's input_dim), string (a categorical value, "
              "hashed to a sparse id; empty gives none), label (exactly one; 0 or 1), ignore. "
              "E.g. \"click:label,age:float:0,visits:int:0,city:string:,comment:ignore\".");
DEFINE_bool(csv_header, false, "csv: the first line is a header, skipped.");
DEFINE_string(csv_delimiter, ",", "csv: the field delimiter, one character (\\t for a tab).");
DEFINE_int64(max_train_examples, 0, "Use at most this many training examples (0: all).");
DEFINE_int64(max_test_examples, 0, "Evaluate on at most this many test examples (0: all).");
DEFINE_int64(synthetic_examples, 200000, "synthetic_ctr: training examples to generate.");
DEFINE_uint64(data_seed, 7, "synthetic_ctr: seed of the planted model and the examples.");
DEFINE_int32(eval_every_secs, 15, "Evaluate the test set this often while training.");
DEFINE_string(metrics_file, "",
              "Path of a file each evaluation is appended to as a JSON line (its directory must "
              "exist).");
DEFINE_int32(final_eval_timeout_secs, 60,
             "With an evaluator task: how long to wait for its evaluation of the final model "
             "before the chief evaluates it itself.");
DEFINE_bool(exit_after_training, false,
            "When training is over (final checkpoint and evaluation taken), tell every ps, "
            "worker and evaluator to stop, wait for them (--exit_grace_secs at most) and exit "
            "0: the whole run ends, as a Kubernetes Job should. Off: keep serving the model.");
DEFINE_int32(exit_grace_secs, 30,
             "--exit_after_training: how long to wait for every task to hear that it must stop.");
DEFINE_string(placement_strategy, "round_robin",
              "How variables are spread over ps tasks: round_robin (TF replica_device_setter) "
              "or greedy (by bytes, TF GreedyLoadBalancingStrategy).");
DEFINE_int64(max_partition_bytes, 0,
             "Variables larger than this are split along their first dimension into partitions "
             "of at most this many bytes. 0: never split this way.");
DEFINE_int64(split_bytes, 0,
             "Variables of at least this many bytes are split into one partition per ps task, "
             "so that every ps serves a share of them (0: 256 KiB; negative: never).");
DEFINE_int32(replication, 1,
             "Copies of every dense partition and table row on the ps tasks: 1, one; 2, a "
             "primary and a backup on another task, which applies each push before the worker "
             "gets its answer and takes over when the primary dies (docs/replication.md; dense "
             "variables in any mode, embedding tables in async and SSP mode without admission or "
             "eviction so far).");
DEFINE_int32(num_virtual_shards, 1024, "Sparse keys hash into this many virtual shards.");
DEFINE_string(checkpoint_dir, "",
              "Directory the checkpoints go to (created if missing; shared with every ps task's "
              "--checkpoint_dir); the newest is restored at start and when a ps task restarts. "
              "Empty: no checkpoints.");
DEFINE_int64(checkpoint_every_steps, 0, "Checkpoint every this many global steps (0: off).");
DEFINE_int32(checkpoint_every_secs, 60, "Checkpoint this often while training (0: off).");
DEFINE_int32(keep_checkpoints, 3,
             "Committed checkpoints kept; older ones are deleted (but for those the kept ones "
             "build on: --full_checkpoint_every).");
DEFINE_int32(full_checkpoint_every, 1,
             "A full checkpoint every this many; those in between are incremental (only the "
             "table rows changed since the checkpoint before, and the keys removed), restored "
             "as the full one and each delta after it. 1: every checkpoint is full.");
DEFINE_int32(checkpoint_timeout_secs, 600,
             "Deadline of each ps task's save or restore of its shards (tables of tens of "
             "millions of rows take tens of seconds).");
DEFINE_string(crash_at, "",
              "Tests only: die of SIGKILL at a point of the checkpoint commit, "
              "\"<point>[@<n>]\" (the n-th time; see storage/crash_points.h).");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "chief: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  pscluster::InitDaemonMain(
      "the chief of a parameter-server training cluster.\n"
      "The cluster comes from TF_CONFIG, --cluster_spec_file, or --chief_hosts/--ps_hosts/"
      "--worker_hosts with --job_name=chief --task_index=0.",
      &argc, &argv);
  using pscluster::v1::DataConfig;
  pscluster::ChiefOptions options;
  options.cluster = pscluster::ClusterConfigFromFlagsOrExit("chief");
  options.host = pscluster::ServiceHostOptionsFromFlags();
  options.heartbeat_interval = absl::Milliseconds(FLAGS_heartbeat_interval_ms);
  options.heartbeat_timeout = absl::Milliseconds(FLAGS_heartbeat_timeout_ms);
  if (!FLAGS_model_config.empty()) {
    absl::Status read = pscluster::ReadProtoFile(FLAGS_model_config, &options.config);
    if (!read.ok()) return Fail("--model_config: " + std::string(read.message()));
  } else if (!FLAGS_model_spec.empty()) {
    absl::Status read = pscluster::ReadProtoFile(FLAGS_model_spec, &options.model);
    if (!read.ok()) return Fail("--model_spec: " + std::string(read.message()));
  }
  if (FLAGS_mode == "async") {
    options.sync.set_mode(pscluster::v1::ASYNC);
  } else if (FLAGS_mode == "sync") {
    options.sync.set_mode(pscluster::v1::SYNC);
    options.sync.set_replicas_to_aggregate(FLAGS_replicas_to_aggregate);
  } else if (FLAGS_mode == "ssp") {
    options.sync.set_mode(pscluster::v1::SSP);
    if (FLAGS_staleness < 0) return Fail("--staleness must be >= 0");
    options.sync.set_staleness(FLAGS_staleness);
  } else {
    return Fail("--mode must be async, sync or ssp, not \"" + FLAGS_mode + "\"");
  }
  if (FLAGS_local_steps < 1) return Fail("--local_steps must be >= 1");
  if (FLAGS_local_steps > 1 && options.sync.mode() == pscluster::v1::SYNC) {
    return Fail(
        "--local_steps needs --mode=async or ssp (sync mode averages each step's gradients)");
  }
  options.sync.set_local_steps(FLAGS_local_steps);
  pscluster::v1::TrainingOptions& t = options.training;
  t.set_batch_size(FLAGS_batch_size);
  t.set_epochs(FLAGS_epochs);
  t.set_max_steps(FLAGS_max_steps);
  t.set_shuffle_seed(FLAGS_shuffle_seed);
  if (FLAGS_batch_size < 1) return Fail("--batch_size must be >= 1");
  DataConfig& data = *t.mutable_data();
  if (FLAGS_data == "fashion_mnist") {
    data.set_kind(DataConfig::FASHION_MNIST);
  } else if (FLAGS_data == "libsvm") {
    data.set_kind(DataConfig::LIBSVM);
  } else if (FLAGS_data == "synthetic_ctr") {
    data.set_kind(DataConfig::SYNTHETIC_CTR);
  } else if (FLAGS_data == "criteo") {
    data.set_kind(DataConfig::CRITEO);
  } else if (FLAGS_data == "csv") {
    data.set_kind(DataConfig::CSV);
  } else if (FLAGS_data == "cifar10") {
    data.set_kind(DataConfig::CIFAR10);
  } else {
    return Fail(
        "--data must be fashion_mnist, cifar10, libsvm, criteo, csv or synthetic_ctr, not \"" +
        FLAGS_data + "\"");
  }
  data.set_path(FLAGS_data_path);
  data.set_test_path(FLAGS_test_data_path);
  data.set_max_train_examples(FLAGS_max_train_examples);
  data.set_max_test_examples(FLAGS_max_test_examples);
  data.set_synthetic_examples(FLAGS_synthetic_examples);
  data.set_seed(FLAGS_data_seed);
  if (data.kind() == DataConfig::CRITEO || data.kind() == DataConfig::CSV) {
    if (FLAGS_data_path.empty() || FLAGS_test_data_path.empty()) {
      return Fail("--data=" + FLAGS_data + " needs --data_path and --test_data_path");
    }
    data.set_hash_buckets(FLAGS_hash_buckets);
  }
  if (data.kind() == DataConfig::CIFAR10 && FLAGS_data_path.empty()) {
    return Fail(
        "--data=cifar10 needs --data_path, the folder of data_batch_1.bin .. "
        "data_batch_5.bin and test_batch.bin");
  }
  if (data.kind() == DataConfig::CRITEO) {
    data.set_criteo_int_columns(FLAGS_criteo_int_columns);
    data.set_criteo_cat_columns(FLAGS_criteo_cat_columns);
  }
  if (data.kind() == DataConfig::CSV) {
    if (FLAGS_csv_columns.empty()) {
      return Fail("--data=csv needs --csv_columns (see --help)");
    }
    auto columns = pscluster::CsvColumnsFromSpec(FLAGS_csv_columns);
    if (!columns.ok()) return Fail("--csv_columns: " + std::string(columns.status().message()));
    for (pscluster::v1::CsvColumn& column : *columns) *data.add_csv_columns() = column;
    data.set_csv_header(FLAGS_csv_header);
    data.set_csv_delimiter(FLAGS_csv_delimiter == "\\t" ? "\t" : FLAGS_csv_delimiter);
  }
  if (!FLAGS_model_config.empty()) {
    absl::Status usable = pscluster::CheckDataConfig(data, options.config);
    if (!usable.ok()) return Fail("--data=" + FLAGS_data + ": " + std::string(usable.message()));
  }
  options.eval_every = absl::Seconds(FLAGS_eval_every_secs);
  options.metrics_path = FLAGS_metrics_file;
  options.final_eval_timeout = absl::Seconds(FLAGS_final_eval_timeout_secs);
  if (FLAGS_exit_grace_secs < 0) return Fail("--exit_grace_secs must be >= 0");
  options.exit_after_training = FLAGS_exit_after_training;
  options.exit_grace = absl::Seconds(FLAGS_exit_grace_secs);
  if (FLAGS_placement_strategy == "round_robin") {
    options.placement.set_strategy(pscluster::v1::PlacementOptions::ROUND_ROBIN);
  } else if (FLAGS_placement_strategy == "greedy") {
    options.placement.set_strategy(pscluster::v1::PlacementOptions::GREEDY_BYTES);
  } else {
    return Fail("--placement_strategy must be round_robin or greedy, not \"" +
                FLAGS_placement_strategy + "\"");
  }
  options.placement.set_max_partition_bytes(FLAGS_max_partition_bytes);
  options.placement.set_split_bytes(FLAGS_split_bytes);
  options.placement.set_num_virtual_shards(FLAGS_num_virtual_shards);
  if (FLAGS_replication != 1 && FLAGS_replication != 2) {
    return Fail("--replication must be 1 (no backup) or 2 (a primary and a backup), not " +
                std::to_string(FLAGS_replication));
  }
  options.placement.set_replication(FLAGS_replication);
  options.checkpoint_dir = FLAGS_checkpoint_dir;
  using pscluster::PathKind;
  pscluster::CheckPathFlagOrExit("chief", "data_path", FLAGS_data_path, PathKind::kExisting);
  pscluster::CheckPathFlagOrExit("chief", "test_data_path", FLAGS_test_data_path,
                                 PathKind::kExisting);
  pscluster::CheckPathFlagOrExit("chief", "metrics_file", FLAGS_metrics_file,
                                 PathKind::kFileToWrite);
  pscluster::CheckPathFlagOrExit("chief", "checkpoint_dir", FLAGS_checkpoint_dir,
                                 PathKind::kDirectoryToCreate);
  options.checkpoint_every_steps = FLAGS_checkpoint_every_steps;
  options.checkpoint_every = absl::Seconds(FLAGS_checkpoint_every_secs);
  options.keep_checkpoints = FLAGS_keep_checkpoints;
  if (FLAGS_full_checkpoint_every < 1) {
    return Fail("--full_checkpoint_every must be >= 1 (1: every checkpoint full), not " +
                std::to_string(FLAGS_full_checkpoint_every));
  }
  options.full_checkpoint_every = FLAGS_full_checkpoint_every;
  if (FLAGS_checkpoint_timeout_secs <= 0) {
    return Fail("--checkpoint_timeout_secs must be positive, not " +
                std::to_string(FLAGS_checkpoint_timeout_secs));
  }
  options.ps_transport.checkpoint_timeout = absl::Seconds(FLAGS_checkpoint_timeout_secs);
  auto crash_points = pscluster::CrashPoints::Parse(FLAGS_crash_at);
  if (!crash_points.ok())
    return Fail("--crash_at: " + std::string(crash_points.status().message()));
  options.crash_points = crash_points->get();
  // Outlives the daemon, whose collectors it calls.
  std::unique_ptr<pscluster::Metrics> metrics =
      pscluster::MetricsFromFlagsOrExit("chief", options.cluster);
  options.host.metrics = metrics.get();
  return pscluster::RunDaemonMain("chief", pscluster::ChiefServer::Create(options));
}
