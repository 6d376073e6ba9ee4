// train_bench: the single-process baseline of the training-throughput benchmark
// (bench/train.sh, bench/gpu_train.sh).
//
// Trains the same model, on the same data, with the same kernels and batch size as one worker
// of a cluster, and does per step exactly what a worker's loop (worker/trainer.cc) does --
// pull every dense variable (and the batch's embedding rows), Model::Compute forward and
// backward, push the gradients, with the next batch prepared on another thread meanwhile --
// but with no RPC: the parameters live in ParameterStore objects of this process
// (InProcessPsTransport, --num_ps stores, 1 by default), so the server-side optimizer, the
// wire encoding of values and the ParameterClient's routing are the same code as in the
// cluster. What the cluster adds on top is the cost of distribution: serialization, gRPC,
// loopback TCP, and the other processes competing for the cores.
//
// Runs --warmup_seconds of training, then --seconds more that it times, and prints a table and
// one machine-readable line:
//   TRAIN_BENCH device=cpu batch=128 steps=N examples=N seconds=S examples_per_second=X
//     step_ms=X pull_ms=X compute_ms=X push_ms=X wait_ms=X cpu_ms=X cores_busy=X
//     other_cores_busy=X loss=X
// (pull/compute/push/wait: mean wall time per step; wait is the time spent waiting for the next
// batch; cpu_ms: CPU time of the whole process, every thread, per step; cores_busy: that over
// the timed seconds; other_cores_busy: the CPU time of every other process of the machine over
// the timed seconds, from /proc/stat -- a figure taken while others used the cores is low).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "chief/in_process_chief.h"
#include "client/parameter_client.h"
#include "common/clock.h"
#include "common/mutex_checks.h"
#include "common/proto_file.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "kernels/kernels.h"
#include "model/data/shard.h"
#include "model/input.h"
#include "model/model.h"
#include "proto/model_config.pb.h"
#include "ps_server/in_process_ps_transport.h"
#include "sharding/placement.h"
#include "worker/step_pipeline.h"
#include "worker/step_source.h"
#include "worker/trainer.h"

DEFINE_string(model_config, "configs/mlp.pbtxt", "The model config (as the chief's flag).");
DEFINE_string(data, "fashion_mnist", "fashion_mnist, libsvm or synthetic_ctr (as the chief's).");
DEFINE_string(data_path, "",
              "fashion_mnist: the folder of the idx files (default "
              "/usr/share/datasets/fashion-mnist); libsvm: the training file.");
DEFINE_int64(max_train_examples, 0, "Use at most this many training examples (0: all).");
DEFINE_string(device, "cpu", "cpu, or gpu:N (the worker's flag).");
DEFINE_int64(gpu_memory_limit_mb, 0, "Cap on the GPU memory, in MiB (0: none).");
DEFINE_int32(batch_size, 128, "Examples per step.");
DEFINE_int32(num_ps, 1, "In-process parameter stores the variables are placed on.");
DEFINE_int32(num_virtual_shards, 1024, "Sparse keys hash into this many virtual shards.");
DEFINE_uint64(shuffle_seed, 1, "Seed of the per-epoch shuffle.");
DEFINE_double(warmup_seconds, 3, "Seconds of training before the timed part.");
DEFINE_double(seconds, 10, "Seconds of timed training.");
DEFINE_string(loop, "sequential",
              "sequential: pull, compute, push one after another, each timed (pull_ms, "
              "compute_ms, push_ms); pipelined: the worker's own training loop (Trainer, async, "
              "with --staleness) against the in-process stores and an in-process chief.");
DEFINE_int32(staleness, 1, "--loop=pipelined: the pipeline's staleness (the worker's flag).");
DEFINE_int32(apply_threads, -1,
             "Threads of each in-process store's apply pool (ps_server's flag); -1: as "
             "ps_server, one per core beyond the first, at most 7.");

namespace pscluster {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// CPU time of this process (every thread), user plus system, in seconds.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU time every process of the machine has used (all but idle and iowait, from /proc/stat's
// first line), in seconds; -1 where there is no /proc/stat.
double MachineCpuSeconds() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double user, nice, system, idle, iowait, irq, softirq, steal;
  if (!(stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) ||
      cpu != "cpu") {
    return -1;
  }
  return (user + nice + system + irq + softirq + steal) / sysconf(_SC_CLK_TCK);
}

// The model and the training examples the flags name.
struct Inputs {
  v1::ModelConfig config;
  v1::ModelSpec spec;
  Dataset train;
};

absl::StatusOr<Inputs> LoadInputs() {
  Inputs in;
  if (absl::Status s = ReadProtoFile(FLAGS_model_config, &in.config); !s.ok()) return s;
  absl::StatusOr<v1::ModelSpec> spec = ModelSpecFromConfig(in.config);
  if (!spec.ok()) return spec.status();
  in.spec = *std::move(spec);
  v1::DataConfig data;
  if (FLAGS_data == "fashion_mnist") {
    data.set_kind(v1::DataConfig::FASHION_MNIST);
  } else if (FLAGS_data == "libsvm") {
    data.set_kind(v1::DataConfig::LIBSVM);
  } else if (FLAGS_data == "synthetic_ctr") {
    data.set_kind(v1::DataConfig::SYNTHETIC_CTR);
  } else {
    return absl::InvalidArgumentError("--data must be fashion_mnist, libsvm or synthetic_ctr");
  }
  data.set_path(FLAGS_data_path);
  data.set_max_train_examples(FLAGS_max_train_examples);
  absl::StatusOr<Dataset> train = LoadDataset(data, in.config.input_dim(), /*train=*/true);
  if (!train.ok()) return train.status();
  in.train = *std::move(train);
  return in;
}

absl::StatusOr<std::unique_ptr<Kernels>> MakeKernels(const std::string& device) {
  if (device == "cpu") return NewCpuKernels();
  int n = -1;
  if (!absl::StartsWith(device, "gpu:") || !absl::SimpleAtoi(device.substr(4), &n) || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu, gpu:N or gpu:N,gpu:M,..., not \"", device, "\""));
  }
  CudaKernelsOptions options;
  options.device = n;
  options.memory_limit_bytes = FLAGS_gpu_memory_limit_mb << 20;
  return NewCudaKernels(options);
}

// The devices of --device: "cpu", "gpu:N" or several GPUs (towers) separated by commas.
absl::StatusOr<std::vector<std::unique_ptr<Kernels>>> MakeDevices(const std::string& devices) {
  std::vector<std::unique_ptr<Kernels>> out;
  for (absl::string_view d : absl::StrSplit(devices, ',')) {
    absl::StatusOr<std::unique_ptr<Kernels>> k = MakeKernels(std::string(d));
    if (!k.ok()) return k.status();
    out.push_back(*std::move(k));
  }
  return out;
}

// The stores apply large updates on --apply_threads threads; by default as many as a ps_server
// would use (one per core beyond the first, at most 7).
ParameterStoreOptions StoreOptions() {
  ParameterStoreOptions options;
  options.apply_threads =
      FLAGS_apply_threads >= 0
          ? FLAGS_apply_threads
          : std::max(0, std::min(static_cast<int>(std::thread::hardware_concurrency()) - 1, 7));
  return options;
}

struct Totals {
  int64_t steps = 0;
  int64_t examples = 0;
  double loss = 0;
  double pull = 0, compute = 0, push = 0, wait = 0;
};

absl::Status Run() {
  absl::StatusOr<Inputs> inputs = LoadInputs();
  if (!inputs.ok()) return inputs.status();
  const v1::ModelConfig& config = inputs->config;
  const v1::ModelSpec* spec = &inputs->spec;
  const Dataset* train = &inputs->train;
  // One worker of one: its shard is every example (what ShardDataset(all, 0, 1) returns).
  Dataset shard = ShardDataset(*train, 0, 1);

  absl::StatusOr<std::unique_ptr<Kernels>> kernels = MakeKernels(FLAGS_device);
  if (!kernels.ok()) return kernels.status();

  v1::PlacementOptions placement_options;
  placement_options.set_num_virtual_shards(FLAGS_num_virtual_shards);
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(*spec, FLAGS_num_ps, placement_options);
  if (!placement.ok()) return placement.status();
  ParameterClientOptions client_options;
  client_options.worker = 0;
  absl::StatusOr<std::unique_ptr<ParameterClient>> client = ParameterClient::Create(
      *spec, *placement, std::make_unique<InProcessPsTransport>(FLAGS_num_ps, StoreOptions()),
      client_options);
  if (!client.ok()) return client.status();
  v1::SyncOptions sync;
  sync.set_mode(v1::ASYNC);
  if (absl::Status s = (*client)->CreateAll(sync); !s.ok()) return s;

  const int batch_size = FLAGS_batch_size;
  // As the worker: a GPU keeps each convolution's patches for its backward pass.
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(
      config, kernels->get(), batch_size, /*keep_patches=*/!(*kernels)->device_is_host());
  if (!model.ok()) return model.status();
  Model& net = **model;
  ParameterClient& ps = **client;
  const std::vector<std::string>& variables = net.dense_variables();
  std::fprintf(stderr,
               "train_bench: %s, %lld examples, batch %d, %s, %d in-process store(s); "
               "%.1f s warm-up, %.1f s timed\n",
               config.name().c_str(), static_cast<long long>(shard.num_examples), batch_size,
               (*kernels)->name().c_str(), FLAGS_num_ps, FLAGS_warmup_seconds, FLAGS_seconds);

  BatchIterator batches(&shard, batch_size, FLAGS_shuffle_seed);
  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> rows(net.tables().size());
  StepResult result;
  Totals warm, timed;
  Totals* totals = &warm;
  const Clock::time_point start = Clock::now();
  Clock::time_point timed_start = start;
  double timed_cpu_start = 0, machine_cpu_start = 0;
  const auto warmup = std::chrono::duration<double>(FLAGS_warmup_seconds);
  const auto measure = std::chrono::duration<double>(FLAGS_seconds);
  bool done = false;
  int64_t step = 0;
  for (int64_t epoch = 0; !done; ++epoch) {
    batches.StartEpoch(epoch);
    auto prepare = [&batches]() {
      PreparedBatch p;
      p.valid = batches.Next(&p.data);
      if (p.valid) Model::PrepareSparse(AsBatch(p.data), &p.sparse);
      return p;
    };
    std::future<PreparedBatch> next = std::async(std::launch::async, prepare);
    while (true) {
      const Clock::time_point t0 = Clock::now();
      PreparedBatch current = next.get();
      if (!current.valid) break;
      next = std::async(std::launch::async, prepare);
      const Clock::time_point t1 = Clock::now();

      // Pull, as Trainer::Run: every dense variable, then each table's rows.
      if (absl::Status s = ps.Pull(variables, &params); !s.ok()) return s;
      for (size_t t = 0; t < net.tables().size(); ++t) {
        rows[t].resize(current.sparse.unique_ids.size() * net.table_dims()[t]);
        if (absl::Status s = ps.PullRows(net.tables()[t], current.sparse.unique_ids.data(),
                                         current.sparse.unique_ids.size(), rows[t].data());
            !s.ok()) {
          return s;
        }
      }
      const Clock::time_point t2 = Clock::now();
      const Batch batch = AsBatch(current.data);
      std::vector<const float*> param_ptrs, row_ptrs;
      for (const auto& p : params) param_ptrs.push_back(p.data());
      for (const auto& r : rows) row_ptrs.push_back(r.data());
      if (absl::Status s = net.Compute(batch, current.sparse, param_ptrs, row_ptrs,
                                       /*backward=*/true, &result);
          !s.ok()) {
        return s;
      }
      const Clock::time_point t3 = Clock::now();
      std::vector<const float*> grads;
      for (const auto& g : result.dense_grads) grads.push_back(g.data());
      if (absl::Status s = ps.Push(variables, grads, step); !s.ok()) return s;
      for (size_t t = 0; t < net.tables().size(); ++t) {
        if (absl::Status s =
                ps.PushRows(net.tables()[t], current.sparse.unique_ids.data(),
                            current.sparse.unique_ids.size(), result.row_grads[t].data(), step);
            !s.ok()) {
          return s;
        }
      }
      const Clock::time_point t4 = Clock::now();
      ++step;

      totals->steps += 1;
      totals->examples += batch.size;
      totals->loss += result.loss;
      totals->wait += Seconds(t1 - t0);
      totals->pull += Seconds(t2 - t1);
      totals->compute += Seconds(t3 - t2);
      totals->push += Seconds(t4 - t3);
      if (totals == &warm && t4 - start >= warmup) {
        totals = &timed;
        timed_start = t4;
        timed_cpu_start = CpuSeconds();
        machine_cpu_start = MachineCpuSeconds();
      } else if (totals == &timed && t4 - timed_start >= measure) {
        done = true;
        break;
      }
    }
    if (next.valid()) next.wait();
  }
  const double seconds = Seconds(Clock::now() - timed_start);
  const double cpu = CpuSeconds() - timed_cpu_start;
  const double machine_cpu = MachineCpuSeconds();
  // Other processes' share of the cores over the timed part (other sessions' builds, say).
  const double other_cores = machine_cpu < 0 || machine_cpu_start < 0
                                 ? -1
                                 : std::max(0.0, (machine_cpu - machine_cpu_start - cpu) / seconds);
  const double n = std::max<int64_t>(1, timed.steps);
  const double eps = timed.examples / seconds;
  const double step_ms = 1e3 * seconds / n;
  std::printf("%-34s %s\n", "device", (*kernels)->name().c_str());
  std::printf("%-34s %d\n", "batch size", batch_size);
  std::printf("%-34s %lld in %.2f s (after %lld warm-up steps)\n", "timed steps",
              static_cast<long long>(timed.steps), seconds, static_cast<long long>(warm.steps));
  std::printf("%-34s %.1f\n", "examples/s", eps);
  std::printf("%-34s %.3f\n", "step time (ms)", step_ms);
  std::printf("%-34s %.3f / %.3f / %.3f / %.3f\n", "pull / compute / push / wait (ms)",
              1e3 * timed.pull / n, 1e3 * timed.compute / n, 1e3 * timed.push / n,
              1e3 * timed.wait / n);
  std::printf("%-34s %.3f (%.2f cores busy; other processes: %.2f)\n", "CPU time per step (ms)",
              1e3 * cpu / n, cpu / seconds, other_cores);
  std::printf("%-34s %.4f\n", "mean training loss (timed steps)", timed.loss / n);
  std::printf(
      "TRAIN_BENCH device=%s batch=%d steps=%lld examples=%lld seconds=%.3f "
      "examples_per_second=%.1f step_ms=%.4f pull_ms=%.4f compute_ms=%.4f push_ms=%.4f "
      "wait_ms=%.4f cpu_ms=%.4f cores_busy=%.2f other_cores_busy=%.2f loss=%.4f\n",
      FLAGS_device.c_str(), batch_size, static_cast<long long>(timed.steps),
      static_cast<long long>(timed.examples), seconds, eps, step_ms, 1e3 * timed.pull / n,
      1e3 * timed.compute / n, 1e3 * timed.push / n, 1e3 * timed.wait / n, 1e3 * cpu / n,
      cpu / seconds, other_cores, timed.loss / n);
  std::fflush(stdout);
  return absl::OkStatus();
}

// --loop=pipelined: the worker's Trainer, as in a cluster but with the chief (InProcessChief)
// and the ps stores in this process; examples/s over the timed window.
absl::Status RunPipelined() {
  absl::StatusOr<Inputs> inputs = LoadInputs();
  if (!inputs.ok()) return inputs.status();
  const v1::ModelConfig& config = inputs->config;
  const Dataset* train = &inputs->train;
  absl::StatusOr<std::vector<std::unique_ptr<Kernels>>> devices = MakeDevices(FLAGS_device);
  if (!devices.ok()) return devices.status();
  std::vector<Kernels*> towers;
  for (const auto& k : *devices) towers.push_back(k.get());

  // The real chief creates and places the variables on the stores and answers the worker's
  // asks for steps, as in a cluster.
  InProcessChief::Options chief_options;
  chief_options.config = config;
  chief_options.placement.set_num_virtual_shards(FLAGS_num_virtual_shards);
  chief_options.training.set_batch_size(FLAGS_batch_size);
  chief_options.training.set_epochs(1000000);  // stopped by the clock
  chief_options.training.set_shuffle_seed(FLAGS_shuffle_seed);
  chief_options.sync.set_mode(v1::ASYNC);
  chief_options.num_ps = FLAGS_num_ps;
  chief_options.store = StoreOptions();
  chief_options.clock = pscluster::Clock::Real();
  absl::StatusOr<std::unique_ptr<InProcessChief>> chief = InProcessChief::Start(chief_options);
  if (!chief.ok()) return chief.status();
  const v1::GetModelResponse& model = (*chief)->model();
  ParameterClientOptions client_options;
  client_options.worker = 0;
  absl::StatusOr<std::unique_ptr<ParameterClient>> client = ParameterClient::Create(
      model.model(), model.placement(), (*chief)->stores().Share(), client_options);
  if (!client.ok()) return client.status();
  ChiefStepSource source((*chief)->client(0), 0);
  TrainerOptions trainer_options;
  trainer_options.staleness = FLAGS_staleness;
  trainer_options.report_every = absl::Seconds(1000);
  Trainer trainer(model, ShardDataset(*train, 0, 1), client->get(), towers, &source,
                  trainer_options);
  std::atomic<bool> stop{false};
  absl::Status result;
  std::thread loop([&] { result = trainer.Run([&stop] { return stop.load(); }); });
  std::fprintf(stderr,
               "train_bench: pipelined, %s, batch %d on %zu device(s) (%s), staleness %d, "
               "%d in-process store(s); %.1f s warm-up, %.1f s timed\n",
               config.name().c_str(), FLAGS_batch_size, towers.size(), FLAGS_device.c_str(),
               FLAGS_staleness, FLAGS_num_ps, FLAGS_warmup_seconds, FLAGS_seconds);
  absl::SleepFor(absl::Seconds(FLAGS_warmup_seconds));
  const int64_t steps0 = trainer.steps();
  const double cpu0 = CpuSeconds();
  const Clock::time_point t0 = Clock::now();
  absl::SleepFor(absl::Seconds(FLAGS_seconds));
  const int64_t steps = trainer.steps() - steps0;
  const double seconds = Seconds(Clock::now() - t0);
  const double cpu = CpuSeconds() - cpu0;
  stop = true;
  loop.join();
  if (!result.ok()) return result;
  const double n = std::max<int64_t>(1, steps);
  const double eps = steps * static_cast<double>(FLAGS_batch_size) / seconds;
  std::printf("%-34s %.1f\n", "examples/s", eps);
  std::printf("%-34s %.3f\n", "step time (ms)", 1e3 * seconds / n);
  std::printf("%-34s %d\n", "staleness (most)", trainer.max_staleness());
  std::printf(
      "TRAIN_BENCH loop=pipelined device=%s batch=%d steps=%lld seconds=%.3f "
      "examples_per_second=%.1f step_ms=%.4f cpu_ms=%.4f max_staleness=%d\n",
      FLAGS_device.c_str(), FLAGS_batch_size, static_cast<long long>(steps), seconds, eps,
      1e3 * seconds / n, 1e3 * cpu / n, trainer.max_staleness());
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "the single-process training baseline: a worker's step (pull, compute, push) against "
      "in-process parameter stores, no RPC.\nusage: train_bench [--device=cpu|gpu:N] "
      "[--batch_size=N] [--seconds=S] [--model_config=F] [--data_path=DIR]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  pscluster::SetMutexChecksFromEnvironment();  // (off: as the daemons)
  FLAGS_logtostderr = true;
  if (FLAGS_batch_size < 1 || FLAGS_num_ps < 1 || FLAGS_seconds <= 0 || FLAGS_warmup_seconds < 0) {
    std::fprintf(stderr,
                 "train_bench: --batch_size and --num_ps must be >= 1, --seconds > 0, "
                 "--warmup_seconds >= 0\n");
    return 2;
  }
  if (FLAGS_loop != "sequential" && FLAGS_loop != "pipelined") {
    std::fprintf(stderr, "train_bench: --loop must be sequential or pipelined\n");
    return 2;
  }
  absl::Status s = FLAGS_loop == "pipelined" ? pscluster::RunPipelined() : pscluster::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
