// cluster_probe: prints the chief's ClusterStatus once, as one line of JSON (protobuf's JSON
// mapping, proto field names), for bench/train_cluster.sh's throughput samples. The same
// message `psctl status --json` is built on, asked with one GetClusterStatus call and nothing
// else, so a sample costs the cluster one small RPC and is timed to within a few milliseconds.
//
//   cluster_probe --chief=HOST:PORT [--tls_ca_file=F --tls_cert_file=F --tls_key_file=F]
// (with TLS, e.g. psctl-viewer's certificate). Exit 1 (with a line on stderr) when the chief does
// not answer within --timeout_ms.
#include <chrono>
#include <cstdio>
#include <string>

#include "gflags/gflags.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "security/tls.h"

DEFINE_string(chief, "", "host:port of the chief.");
DEFINE_int32(timeout_ms, 5000, "Deadline of the call.");
DEFINE_string(tls_ca_file, "", "Mutual TLS: the cluster's CA (PEM); with the two below.");
DEFINE_string(tls_cert_file, "", "Mutual TLS: this client's certificate (PEM).");
DEFINE_string(tls_key_file, "", "Mutual TLS: this client's key (PEM).");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("prints the chief's ClusterStatus as one line of JSON");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_chief.empty()) {
    std::fprintf(stderr, "cluster_probe: --chief=HOST:PORT is required\n");
    return 2;
  }
  pscluster::TlsConfig tls;
  tls.ca_file = FLAGS_tls_ca_file;
  tls.cert_file = FLAGS_tls_cert_file;
  tls.key_file = FLAGS_tls_key_file;
  if (absl::Status valid = pscluster::ValidateTlsConfig(tls); !valid.ok()) {
    std::fprintf(stderr, "cluster_probe: %s\n", std::string(valid.message()).c_str());
    return 2;
  }
  auto stub = pscluster::v1::Coordinator::NewStub(
      grpc::CreateChannel(FLAGS_chief, pscluster::ChannelCredentialsFor(tls)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(FLAGS_timeout_ms));
  pscluster::v1::ClusterStatus status;
  grpc::Status s = stub->GetClusterStatus(&ctx, pscluster::v1::GetClusterStatusRequest(), &status);
  if (!s.ok()) {
    std::fprintf(stderr, "cluster_probe: cannot reach the chief at %s: %s\n", FLAGS_chief.c_str(),
                 s.error_message().c_str());
    return 1;
  }
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  google::protobuf::util::MessageToJsonString(status, &out, options);
  std::printf("%s\n", out.c_str());
  return 0;
}
