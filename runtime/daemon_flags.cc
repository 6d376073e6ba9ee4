#include "runtime/daemon_flags.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/cluster_spec.h"
#include "common/mutex_checks.h"
#include "common/version.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "runtime/termination.h"

DEFINE_string(chief_hosts, "", "Address (host:port) of the chief task (TF1-style flags).");
DEFINE_string(ps_hosts, "", "Addresses (host:port, comma-separated) of the ps tasks.");
DEFINE_string(worker_hosts, "", "Addresses (host:port, comma-separated) of the worker tasks.");
DEFINE_string(evaluator_hosts, "", "Address (host:port) of the evaluator task, if any.");
DEFINE_string(job_name, "", "This task's job: chief, ps, worker or evaluator.");
DEFINE_int32(task_index, -1, "This task's index within its job.");
DEFINE_string(cluster_spec_file, "",
              "Path of a JSON file in TF_CONFIG format; used when no *_hosts flag is given.");
DEFINE_string(port_file, "",
              "Path of a file the port actually bound is written to (its directory must exist).");
DEFINE_int32(max_message_bytes, 64 << 20, "Largest gRPC message sent or received, in bytes.");
DEFINE_int32(max_concurrent_streams, 256,
             "Calls one peer's connection may have open at once; more wait (0: no limit).");
DEFINE_string(tls_ca_file, "",
              "PEM file of the cluster's CA: with --tls_cert_file and --tls_key_file, every "
              "channel (served and dialed) uses mutual TLS, and calls are checked against the "
              "caller's role (docs/security.md). deploy/tls/make_certs.sh makes the files.");
DEFINE_string(tls_cert_file, "", "PEM file of this process's certificate (see --tls_ca_file).");
DEFINE_string(tls_key_file, "", "PEM file of this process's private key (see --tls_ca_file).");
DEFINE_int32(tls_refresh_s, 60,
             "How often the TLS files are checked for changes (rotated certificates are used "
             "without a restart), in seconds.");
DEFINE_bool(allow_insecure, false,
            "Serve plaintext on a non-loopback address without TLS: anyone who can reach the "
            "port may call anything. Without this, a daemon bound beyond loopback refuses to "
            "start without --tls_* files.");
DEFINE_bool(grpc_reflection, false, "Serve gRPC server reflection (for grpc_cli).");
DEFINE_int32(shutdown_grace_ms, 2000,
             "On SIGTERM/SIGINT, calls in flight get this long to finish, in milliseconds.");

DEFINE_int32(metrics_port, -1,
             "Serve Prometheus metrics (http://HOST:PORT/metrics) on this port, bound as the "
             "gRPC port is (the task's host); 0: any free port (see --metrics_port_file); -1: "
             "off. The endpoint is plaintext and read-only.");
DEFINE_string(metrics_port_file, "",
              "Path of a file the metrics port actually bound is written to (its directory must "
              "exist).");

DECLARE_bool(help);
DECLARE_bool(helpshort);

namespace pscluster {
namespace {

// --help shows the project's flags only, in these groups (the shared ones) and then the
// program's own; --helpfull shows every flag, the logging library's too.
struct FlagGroup {
  const char* title;
  std::vector<std::string> flags;
  bool for_psctl;
};

const FlagGroup& SharedGroup(int i) {
  static const FlagGroup* const kGroups = new FlagGroup[3]{
      {"Cluster spec (else the TF_CONFIG environment variable)",
       {"chief_hosts", "ps_hosts", "worker_hosts", "evaluator_hosts", "job_name", "task_index",
        "cluster_spec_file"},
       true},
      {"Mutual TLS (docs/security.md)",
       {"tls_ca_file", "tls_cert_file", "tls_key_file", "tls_refresh_s", "allow_insecure"},
       true},
      {"Server",
       {"port_file", "max_message_bytes", "max_concurrent_streams", "grpc_reflection",
        "shutdown_grace_ms", "metrics_port", "metrics_port_file"},
       false},
  };
  return kGroups[i];
}

// Wraps `text` at 96 columns, each line indented by `indent` spaces.
std::string Wrap(const std::string& text, int indent) {
  std::string out;
  int column = 0;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > 0 && column + 1 + static_cast<int>(word.size()) > 96) {
      out += "\n";
      column = 0;
    }
    if (column == 0) {
      out.append(indent, ' ');
      column = indent;
    } else {
      out += ' ';
      ++column;
    }
    out.append(word.data(), word.size());
    column += static_cast<int>(word.size());
  }
  return out + "\n";
}

void PrintFlag(const gflags::CommandLineFlagInfo& flag) {
  std::string line = "  --" + flag.name;
  if (flag.type == "string") {
    line += flag.default_value.empty() ? "" : "  (default \"" + flag.default_value + "\")";
  } else {
    line += "  (" + flag.type + ", default " + flag.default_value + ")";
  }
  std::printf("%s\n%s", line.c_str(), Wrap(flag.description, 6).c_str());
}

// The program's own flags are defined in its main file (chief/main.cc, cli/psctl.cc...).
bool IsProgramFlag(const std::string& file) {
  for (const char* dir : {"chief/", "ps_server/", "worker/", "evaluator/", "cli/"}) {
    if (absl::StartsWith(file, dir)) return true;
  }
  return false;
}

void PrintProjectHelp(const std::string& program) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::map<std::string, const gflags::CommandLineFlagInfo*> by_name;
  for (const gflags::CommandLineFlagInfo& f : flags) by_name[f.name] = &f;
  std::printf("%s: %s\n", program.c_str(), gflags::ProgramUsage());
  std::printf("\n%s flags:\n", program.c_str());
  for (const gflags::CommandLineFlagInfo& f : flags) {
    if (IsProgramFlag(f.filename)) PrintFlag(f);
  }
  for (int i = 0; i < 3; ++i) {
    const FlagGroup& group = SharedGroup(i);
    if (program == "psctl" && !group.for_psctl) continue;
    std::printf("\n%s:\n", group.title);
    for (const std::string& name : group.flags) {
      auto it = by_name.find(name);
      if (it != by_name.end()) PrintFlag(*it->second);
    }
  }
  std::printf(
      "\nLogs go to stderr (glog). --helpfull lists every flag, the logging library's too;\n"
      "--version prints the version and commit.\n");
}

}  // namespace

void InitDaemonMain(const char* usage, int* argc, char*** argv) {
  BlockTerminationSignals();
  FLAGS_logtostderr = true;
  gflags::SetUsageMessage(usage);
  gflags::SetVersionString(VersionString());
  gflags::ParseCommandLineNonHelpFlags(argc, argv, true);
  if (FLAGS_help || FLAGS_helpshort) {
    // Asking for help is not an error (gflags would exit with 1).
    PrintProjectHelp(std::string(
        absl::string_view((*argv)[0]).substr(absl::string_view((*argv)[0]).find_last_of('/') + 1)));
    std::exit(0);
  }
  gflags::HandleCommandLineHelpFlags();
  google::InitGoogleLogging((*argv)[0]);
  SetMutexChecksFromEnvironment();
}

absl::StatusOr<v1::ClusterConfig> ClusterConfigFromFlags() {
  ClusterConfigSources sources;
  sources.chief_hosts = FLAGS_chief_hosts;
  sources.ps_hosts = FLAGS_ps_hosts;
  sources.worker_hosts = FLAGS_worker_hosts;
  sources.evaluator_hosts = FLAGS_evaluator_hosts;
  sources.job_name = FLAGS_job_name;
  sources.task_index = FLAGS_task_index;
  sources.cluster_spec_file = FLAGS_cluster_spec_file;
  if (const char* tf_config = std::getenv("TF_CONFIG")) sources.tf_config = tf_config;
  return ResolveClusterConfig(sources);
}

v1::ClusterConfig ClusterConfigFromFlagsOrExit(const char* name) {
  absl::StatusOr<v1::ClusterConfig> config = ClusterConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "%s: invalid cluster spec: %s\n", name,
                 std::string(config.status().message()).c_str());
    std::exit(2);
  }
  return *std::move(config);
}

TlsConfig TlsConfigFromFlags() {
  TlsConfig tls;
  tls.ca_file = FLAGS_tls_ca_file;
  tls.cert_file = FLAGS_tls_cert_file;
  tls.key_file = FLAGS_tls_key_file;
  tls.refresh_interval_s = FLAGS_tls_refresh_s;
  return tls;
}

ServiceHostOptions ServiceHostOptionsFromFlags() {
  ServiceHostOptions options;
  options.tls = TlsConfigFromFlags();
  options.allow_insecure = FLAGS_allow_insecure;
  options.reflection = FLAGS_grpc_reflection;
  options.port_file = FLAGS_port_file;
  options.max_message_bytes = FLAGS_max_message_bytes;
  options.max_concurrent_streams = FLAGS_max_concurrent_streams;
  options.shutdown_grace = absl::Milliseconds(FLAGS_shutdown_grace_ms);
  return options;
}

std::unique_ptr<Metrics> MetricsFromFlagsOrExit(const char* name,
                                                const v1::ClusterConfig& cluster) {
  // The shared path flags are checked here, which every daemon's main() calls.
  CheckPathFlagOrExit(name, "port_file", FLAGS_port_file, PathKind::kFileToWrite);
  CheckPathFlagOrExit(name, "metrics_port_file", FLAGS_metrics_port_file, PathKind::kFileToWrite);
  if (FLAGS_metrics_port < 0) return nullptr;
  if (FLAGS_metrics_port > 65535) {
    std::fprintf(stderr, "%s: --metrics_port %d is not a port (0-65535, or -1: off)\n", name,
                 FLAGS_metrics_port);
    std::exit(2);
  }
  absl::StatusOr<std::string> address =
      TaskAddress(cluster.cluster(), cluster.task().job(), cluster.task().index());
  absl::StatusOr<HostPort> hp =
      address.ok() ? ParseHostPort(*address) : absl::StatusOr<HostPort>(address.status());
  if (!hp.ok()) {
    std::fprintf(stderr, "%s: metrics: %s\n", name, std::string(hp.status().message()).c_str());
    std::exit(2);
  }
  MetricsOptions options;
  options.address = JoinHostPort(BindHostFor(hp->host), FLAGS_metrics_port);
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Start(options);
  if (metrics.ok() && !FLAGS_metrics_port_file.empty()) {
    absl::Status written =
        WriteFileAtomically(FLAGS_metrics_port_file, absl::StrCat((*metrics)->port(), "\n"));
    if (!written.ok()) metrics = written;
  }
  if (!metrics.ok()) {
    std::fprintf(stderr, "%s: --metrics_port: %s\n", name,
                 std::string(metrics.status().message()).c_str());
    std::exit(2);
  }
  LOG(INFO) << name << ": Prometheus metrics on http://"
            << JoinHostPort(BindHostFor(hp->host), (*metrics)->port()) << "/metrics";
  return *std::move(metrics);
}

void CheckPathFlagOrExit(const char* name, const char* flag, const std::string& path,
                         PathKind kind) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string problem;
  switch (kind) {
    case PathKind::kExisting:
      if (!fs::exists(path, ec)) {
        problem = "no such file or directory";
      } else if (access(path.c_str(), R_OK) != 0) {
        problem = "not readable by this user";
      }
      break;
    case PathKind::kDirectory:
      if (!fs::is_directory(path, ec)) problem = "not an existing directory";
      break;
    case PathKind::kWritableDirectory:
      if (!fs::is_directory(path, ec)) {
        problem = "not an existing directory";
      } else if (access(path.c_str(), W_OK | X_OK) != 0) {
        problem = "not writable by this user (uid " + std::to_string(getuid()) +
                  "; on a shared volume, give the export to this uid or its group)";
      }
      break;
    case PathKind::kDirectoryToCreate:
      if (!fs::exists(path, ec) && !fs::create_directories(path, ec)) {
        problem = "cannot create it: " + ec.message();
      } else if (!fs::is_directory(path, ec)) {
        problem = "not a directory";
      } else if (access(path.c_str(), W_OK | X_OK) != 0) {
        problem = "not writable by this user (uid " + std::to_string(getuid()) + ")";
      }
      break;
    case PathKind::kFileToWrite: {
      fs::path dir = fs::path(path).parent_path();
      if (dir.empty()) dir = ".";
      if (fs::is_directory(path, ec)) {
        problem = "is a directory, expected a file";
      } else if (!fs::is_directory(dir, ec)) {
        problem = "its directory " + dir.string() + " does not exist";
      } else if (access(dir.c_str(), W_OK | X_OK) != 0) {
        problem = "its directory " + dir.string() + " is not writable by this user";
      }
      break;
    }
  }
  if (problem.empty()) return;
  std::fprintf(stderr, "%s: --%s %s: %s\n", name, flag, path.c_str(), problem.c_str());
  std::exit(2);
}

}  // namespace pscluster
