// psctl: the operator's window into a live cluster. Parses flags and dispatches commands.
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/status_command.h"
#include "cli/watch_command.h"
#include "common/cluster_spec.h"
#include "common/daemon_flags.h"
#include "gflags/gflags.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

DEFINE_string(chief, "", "host:port of the chief. When empty, the cluster spec names it.");
DEFINE_bool(json, false, "Print JSON instead of a table.");
DEFINE_double(interval_secs, 5, "watch: seconds between progress lines.");
DECLARE_string(job_name);
DECLARE_int32(task_index);

namespace {

constexpr char kUsage[] =
    "inspect a live parameter-server cluster.\n"
    "usage: psctl [--chief=HOST:PORT | cluster spec flags or TF_CONFIG] [--json] COMMAND\n"
    "commands:\n"
    "  status   every task with its role, address, health, uptime and step\n"
    "  watch    training progress every --interval_secs until it finishes, then the final "
    "test accuracy";

int Fail(const std::string& message) {
  std::fprintf(stderr, "psctl: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  pscluster::InitDaemonMain(kUsage, &argc, &argv);
  if (argc != 2) return Fail(std::string("expected one command\n") + kUsage);
  const std::string command = argv[1];

  std::string chief = FLAGS_chief;
  if (chief.empty()) {
    // psctl is no task of the cluster; it reads the spec as if it were the chief.
    FLAGS_job_name = "chief";
    FLAGS_task_index = 0;
    absl::StatusOr<pscluster::v1::ClusterConfig> config = pscluster::ClusterConfigFromFlags();
    if (!config.ok()) {
      return Fail("no chief: give --chief=HOST:PORT or a cluster spec (" +
                  std::string(config.status().message()) + ")");
    }
    chief = *pscluster::TaskAddress(config->cluster(), "chief", 0);
  }
  auto stub = pscluster::v1::Coordinator::NewStub(
      grpc::CreateChannel(chief, grpc::InsecureChannelCredentials()));

  if (command == "status") {
    absl::StatusOr<std::string> out = pscluster::RunStatusCommand(*stub, chief, FLAGS_json);
    if (!out.ok()) return Fail(std::string(out.status().message()));
    std::cout << *out;
    return 0;
  }
  if (command == "watch") {
    absl::Status s = pscluster::RunWatchCommand(*stub, chief, absl::Seconds(FLAGS_interval_secs),
                                                absl::Seconds(30), std::cout);
    if (!s.ok()) return Fail(std::string(s.message()));
    return 0;
  }
  return Fail("unknown command \"" + command + "\"\n" + kUsage);
}
