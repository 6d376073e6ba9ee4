#ifndef PSCLUSTER_RUNTIME_DAEMON_FLAGS_H_
#define PSCLUSTER_RUNTIME_DAEMON_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/cluster.pb.h"
#include "runtime/metrics.h"
#include "runtime/service_host.h"

namespace pscluster {

// Flags shared by the daemons' main(). For binaries only: these read gflags and the
// environment; libraries take a ClusterConfig and options structs instead.

// The start of every daemon's main(): blocks SIGTERM/SIGINT (see BlockTerminationSignals),
// logs to stderr unless --logtostderr=false, parses flags and starts glog. --help (and
// --helpshort) lists the project's flags by group, --helpfull every flag, --version the
// version and commit (common/version.h); each exits 0. absl::Mutex's deadlock detection is off
// unless PSCLUSTER_MUTEX_DEADLOCK_DETECTION asks for it (common/mutex_checks.h).
void InitDaemonMain(const char* usage, int* argc, char*** argv);

// The cluster spec from --ps_hosts, --worker_hosts, --chief_hosts, --evaluator_hosts,
// --job_name, --task_index, --cluster_spec_file, then the TF_CONFIG environment variable
// (see ClusterConfigSources).
absl::StatusOr<v1::ClusterConfig> ClusterConfigFromFlags();

// ClusterConfigFromFlags(), or on error prints "NAME: invalid cluster spec: WHY" as one line
// to stderr and exits with code 2.
v1::ClusterConfig ClusterConfigFromFlagsOrExit(const char* name);

// Mutual TLS files from --tls_ca_file, --tls_cert_file, --tls_key_file, --tls_refresh_s
// (all empty: plaintext).
TlsConfig TlsConfigFromFlags();

// Server settings from --tls_*, --allow_insecure, --grpc_reflection, --port_file,
// --max_message_bytes, --max_concurrent_streams, --shutdown_grace_ms. The address is left for
// the daemon to take from the cluster spec.
ServiceHostOptions ServiceHostOptionsFromFlags();

// What a path flag must name, checked at start (CheckPathFlagOrExit).
enum class PathKind {
  kExisting,           // a file or directory that exists and can be read
  kDirectory,          // an existing directory
  kWritableDirectory,  // an existing directory this user can write into (a mount: not created)
  kDirectoryToCreate,  // a directory, created (with its parents) if missing, writable
  kFileToWrite,        // a file whose directory exists and is writable
};

// For main(): when `path` is not empty and is not what `kind` asks for, prints
// "NAME: --FLAG PATH: WHY" to stderr and exits with code 2, before the daemon starts.
void CheckPathFlagOrExit(const char* name, const char* flag, const std::string& path,
                         PathKind kind);

// The Prometheus endpoint of --metrics_port and --metrics_port_file, on the task's bind host
// (as the gRPC server's); null when --metrics_port is -1 (off). On error prints
// "NAME: WHY" to stderr and exits with code 2. Keep it alive longer than the daemon.
std::unique_ptr<Metrics> MetricsFromFlagsOrExit(const char* name, const v1::ClusterConfig& cluster);

}  // namespace pscluster

#endif  // PSCLUSTER_RUNTIME_DAEMON_FLAGS_H_
