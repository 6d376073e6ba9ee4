// psctl: the operator's window into a cluster, live or checkpointed. Parses flags and
// dispatches to the command libraries.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/checkpoint_source.h"
#include "cli/ckpt_command.h"
#include "cli/command_output.h"
#include "cli/dump_command.h"
#include "cli/live_cluster.h"
#include "cli/save_command.h"
#include "cli/shard_command.h"
#include "cli/status_command.h"
#include "cli/variable_source.h"
#include "cli/vars_command.h"
#include "cli/watch_command.h"
#include "client/chief_client.h"
#include "client/grpc_channel.h"
#include "client/grpc_chief_client.h"
#include "common/cluster_spec.h"
#include "gflags/gflags.h"
#include "grpcpp/client_context.h"
#include "proto/health.grpc.pb.h"
#include "runtime/daemon_flags.h"

DEFINE_string(chief, "",
              "Address (host:port) of the chief. When empty, the cluster spec names it.");
DEFINE_string(cluster, "",
              "The cluster spec in TF_CONFIG format: the JSON itself, or a file holding it. "
              "When empty, --chief, the *_hosts flags, --cluster_spec_file or TF_CONFIG.");
DEFINE_bool(json, false, "Print JSON instead of a table.");
DEFINE_double(interval_secs, 5, "watch: seconds between progress lines.");
DEFINE_double(rate_window_secs, 1,
              "status: push and pull rates are measured over this many seconds (0: no rates).");
DEFINE_double(rpc_timeout_secs, 10, "Deadline of each call to the chief or a ps task.");
DEFINE_bool(values, false, "shard: also print a slice of the values (--offset, --count).");
DEFINE_int64(offset, 0, "shard --values: first element of the slice, within each shard.");
DEFINE_int64(count, 16, "shard --values: elements in the slice.");
DEFINE_string(key, "", "table: print these rows (comma-separated keys); never creates a row.");
DEFINE_string(out, "", "dump: the .npy file to write (with --all: the directory).");
DEFINE_bool(all, false, "dump: every dense variable, one .npy each, plus index.json.");
DEFINE_string(checkpoint, "",
              "dump: read from this checkpoint (a ckpt-* directory, or a directory of "
              "checkpoints for its newest) instead of the live cluster.");
DEFINE_string(tls_server_name, "",
              "health: with TLS, the name the server's certificate must carry when it is not "
              "the address's host (a probe that dials 127.0.0.1).");
DEFINE_bool(alive, false,
            "health: exit 0 whenever the task answers, SERVING or not (a liveness probe: a ps "
            "waiting for its chief is alive but not ready).");
DEFINE_double(save_timeout_secs, 600, "save: how long to wait for the checkpoint to commit.");
DECLARE_string(job_name);
DECLARE_int32(task_index);

namespace {

constexpr char kUsage[] =
    "inspect a parameter-server cluster, live or from its checkpoints.\n"
    "usage: psctl [--chief=HOST:PORT | --cluster=TF_CONFIG | cluster spec flags or TF_CONFIG]\n"
    "             [--json] COMMAND [ARGS]\n"
    "commands on a live cluster (they only read, except save):\n"
    "  status                 every task: role, address, health, uptime, step, push/pull rates,\n"
    "                         and who the cluster waits for\n"
    "  watch                  training progress every --interval_secs until it finishes\n"
    "  vars                   every variable and table: shape, dtype, partitions and the ps task\n"
    "                         of each, bytes with optimizer slots, optimizer\n"
    "  shard VAR[/PART]       value statistics of a shard (all of VAR's without /PART);\n"
    "                         --values [--offset=N --count=N] prints a slice\n"
    "  table NAME [--key=K,..]  rows, memory and hot keys per ps task; --key prints those rows\n"
    "  dump VAR --out=F.npy   the whole variable as .npy (--checkpoint=PATH: from a checkpoint)\n"
    "  dump --all --out=DIR   every dense variable as DIR/NAME.npy plus DIR/index.json\n"
    "  save                   take a checkpoint now and wait until it is committed\n"
    "  health HOST:PORT       one gRPC health check of any task (0: SERVING, 1: not; --alive:\n"
    "                         0 whenever it answers); for Kubernetes probes (--tls_server_name\n"
    "                         when dialling 127.0.0.1)\n"
    "commands on checkpoints (offline):\n"
    "  ckpt list DIR          the committed checkpoints under DIR, newest first\n"
    "  ckpt show PATH         a checkpoint's manifest (PATH: a ckpt-* dir, or DIR for the newest)\n"
    "  ckpt verify PATH       check every shard against its checksum\n"
    "exit status: 0 when everything was read, 1 when something was not (what could be read is\n"
    "still printed, the reason goes to stderr), 2 for a usage error";

int Usage(const std::string& message) {
  std::fprintf(stderr, "psctl: %s\n%s\n", message.c_str(), kUsage);
  return 2;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "psctl: %s\n", message.c_str());
  return 1;
}

int Print(const pscluster::CommandOutput& out) {
  std::cout << out.text << std::flush;
  if (!out.status.ok()) return Fail(std::string(out.status.message()));
  return 0;
}

pscluster::OutputFormat Format() {
  return FLAGS_json ? pscluster::OutputFormat::kJson : pscluster::OutputFormat::kTable;
}

absl::Duration Seconds(double s) { return absl::Milliseconds(static_cast<int64_t>(s * 1000)); }

// The chief's address: --chief, else the chief of --cluster, else of the daemons' cluster spec
// sources (psctl is no task of the cluster; it reads the spec as if it were the chief).
absl::StatusOr<std::string> ChiefAddress() {
  if (!FLAGS_chief.empty()) return FLAGS_chief;
  absl::StatusOr<pscluster::v1::ClusterConfig> config;
  if (!FLAGS_cluster.empty()) {
    pscluster::ClusterConfigSources sources;
    sources.job_name = "chief";
    sources.task_index = 0;
    if (absl::string_view(FLAGS_cluster).find('{') != absl::string_view::npos) {
      sources.tf_config = FLAGS_cluster;
    } else {
      sources.cluster_spec_file = FLAGS_cluster;
    }
    config = pscluster::ResolveClusterConfig(sources);
  } else {
    FLAGS_job_name = "chief";
    FLAGS_task_index = 0;
    config = pscluster::ClusterConfigFromFlags();
  }
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no chief: give --chief=HOST:PORT, --cluster or a cluster spec (",
                     config.status().message(), ")"));
  }
  return pscluster::TaskAddress(config->cluster(), "chief", 0);
}

// The chief of a live cluster, with psctl's deadlines.
absl::StatusOr<std::unique_ptr<pscluster::ChiefClient>> ConnectChief() {
  absl::StatusOr<std::string> address = ChiefAddress();
  if (!address.ok()) return address.status();
  pscluster::ChiefClientOptions options;
  options.rpc_timeout = Seconds(FLAGS_rpc_timeout_secs);
  options.checkpoint_timeout = Seconds(FLAGS_save_timeout_secs);
  pscluster::GrpcChannelOptions channel;
  channel.tls = pscluster::TlsConfigFromFlags();
  return pscluster::NewGrpcChiefClient(*address, options, channel);
}

absl::StatusOr<std::vector<int64_t>> ParseKeys(const std::string& list) {
  std::vector<int64_t> keys;
  for (absl::string_view k : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    int64_t key;
    if (!absl::SimpleAtoi(k, &key)) {
      return absl::InvalidArgumentError(absl::StrCat("--key: \"", k, "\" is not an integer"));
    }
    keys.push_back(key);
  }
  return keys;
}

int RunCkpt(const std::vector<std::string>& args) {
  if (args.size() != 3) return Usage("ckpt takes a subcommand (list, show, verify) and a path");
  const std::string& sub = args[1];
  if (sub == "list") return Print(pscluster::RunCheckpointListCommand(args[2], Format()));
  if (sub == "show") return Print(pscluster::RunCheckpointShowCommand(args[2], Format()));
  if (sub == "verify") return Print(pscluster::RunCheckpointVerifyCommand(args[2], Format()));
  return Usage("unknown ckpt subcommand \"" + sub + "\"");
}

// dump VAR [CHECKPOINT] --out=F.npy, or dump --all --out=DIR.
int RunDump(const std::vector<std::string>& args) {
  if (FLAGS_out.empty()) return Usage("dump needs --out");
  const size_t names = FLAGS_all ? 0 : 1;
  if (args.size() < 1 + names || args.size() > 2 + names) {
    return Usage(FLAGS_all ? "dump --all takes no variable"
                           : "dump takes one variable (and optionally a checkpoint path)");
  }
  std::string checkpoint = FLAGS_checkpoint;
  if (args.size() == 2 + names) {
    if (!checkpoint.empty()) return Usage("dump: give the checkpoint once");
    checkpoint = args[1 + names];
  }
  // Declared in this order so that the source goes before the cluster it reads.
  std::unique_ptr<pscluster::ChiefClient> chief;
  pscluster::LiveCluster cluster;
  std::unique_ptr<pscluster::DenseVariableSource> source;
  if (!checkpoint.empty()) {
    auto opened = pscluster::CheckpointVariableSource::Open(checkpoint);
    if (!opened.ok()) return Fail(std::string(opened.status().message()));
    source = *std::move(opened);
  } else {
    absl::StatusOr<std::unique_ptr<pscluster::ChiefClient>> connected = ConnectChief();
    if (!connected.ok()) return Usage(std::string(connected.status().message()));
    chief = *std::move(connected);
    pscluster::LiveClusterOptions options;
    options.rpc_timeout = Seconds(FLAGS_rpc_timeout_secs);
    options.tls = pscluster::TlsConfigFromFlags();
    auto live = pscluster::ConnectToCluster(*chief, options);
    if (!live.ok()) return Fail(std::string(live.status().message()));
    cluster = *std::move(live);
    source = std::make_unique<pscluster::LiveVariableSource>(&cluster);
  }
  if (FLAGS_all) return Print(pscluster::RunExportCommand(*source, FLAGS_out, Format()));
  return Print(pscluster::RunDumpCommand(*source, args[1], FLAGS_out, Format()));
}

// One grpc.health.v1 Check of a task, for probes: exit 0 if it answers SERVING.
int RunHealth(const std::vector<std::string>& args) {
  if (args.size() != 2) return Usage("health takes one address (HOST:PORT)");
  pscluster::GrpcChannelOptions channel;
  channel.tls = pscluster::TlsConfigFromFlags();
  channel.tls_server_name = FLAGS_tls_server_name;
  auto stub = grpc::health::v1::Health::NewStub(pscluster::NewGrpcChannel(args[1], channel));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + Seconds(FLAGS_rpc_timeout_secs)));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  if (!s.ok()) return Fail(args[1] + ": health check failed: " + s.error_message());
  const std::string status =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  std::cout << args[1] << ": " << status << std::endl;
  if (FLAGS_alive) return 0;
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  pscluster::InitDaemonMain(kUsage, &argc, &argv);
  if (argc < 2) return Usage("expected a command");
  const std::vector<std::string> args(argv + 1, argv + argc);
  const std::string& command = args[0];

  // Offline: no cluster needed.
  if (command == "ckpt") return RunCkpt(args);
  if (command == "dump") return RunDump(args);
  if (command == "health") return RunHealth(args);

  const size_t expected_args = command == "shard" || command == "table" ? 2 : 1;
  if (args.size() != expected_args) {
    return Usage(expected_args == 2 ? command + " takes one name" : command + " takes no argument");
  }
  if (command != "status" && command != "watch" && command != "vars" && command != "shard" &&
      command != "table" && command != "save") {
    return Usage("unknown command \"" + command + "\"");
  }
  absl::StatusOr<std::unique_ptr<pscluster::ChiefClient>> connected = ConnectChief();
  if (!connected.ok()) return Usage(std::string(connected.status().message()));
  pscluster::ChiefClient& chief = **connected;

  if (command == "status") {
    pscluster::StatusOptions options;
    options.rate_window = Seconds(FLAGS_rate_window_secs);
    options.rpc_timeout = Seconds(FLAGS_rpc_timeout_secs);
    options.format = Format();
    options.tls = pscluster::TlsConfigFromFlags();
    return Print(pscluster::RunStatusCommand(chief, options));
  }
  if (command == "watch") {
    absl::Status s = pscluster::RunWatchCommand(chief, Seconds(FLAGS_interval_secs),
                                                absl::Seconds(30), std::cout);
    if (!s.ok()) return Fail(std::string(s.message()));
    return 0;
  }
  if (command == "save") {
    return Print(pscluster::RunSaveCommand(chief, Format()));
  }

  pscluster::LiveClusterOptions options;
  options.rpc_timeout = Seconds(FLAGS_rpc_timeout_secs);
  options.tls = pscluster::TlsConfigFromFlags();
  absl::StatusOr<pscluster::LiveCluster> cluster = pscluster::ConnectToCluster(chief, options);
  if (!cluster.ok()) return Fail(std::string(cluster.status().message()));
  if (command == "vars") return Print(pscluster::RunVarsCommand(*cluster, Format()));
  if (command == "shard") {
    pscluster::ShardOptions shard;
    shard.values_offset = FLAGS_offset;
    shard.values_count = FLAGS_values ? FLAGS_count : 0;
    shard.format = Format();
    return Print(pscluster::RunShardCommand(*cluster, args[1], shard));
  }
  pscluster::TableOptions table;
  absl::StatusOr<std::vector<int64_t>> keys = ParseKeys(FLAGS_key);
  if (!keys.ok()) return Usage(std::string(keys.status().message()));
  table.keys = *std::move(keys);
  table.format = Format();
  return Print(pscluster::RunTableCommand(*cluster, args[1], table));
}
