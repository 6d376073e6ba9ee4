#include "runtime/service_host.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "runtime/metrics.h"

namespace pscluster {
namespace {

bool IsNumericHost(const std::string& host) {
  unsigned char buf[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

std::string BindHostFor(const std::string& host) {
  if (host == "localhost") return "127.0.0.1";
  return IsNumericHost(host) ? host : "0.0.0.0";
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", strerror(errno)));
  }
  const bool written =
      write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size());
  const bool synced = fsync(fd) == 0;
  close(fd);
  if (!written || !synced || rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = strerror(errno);
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", err));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ServiceHost>> ServiceHost::Start(
    const ServiceHostOptions& options, const std::vector<grpc::Service*>& services) {
  PS_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(options.address));
  const std::string bind_host = BindHostFor(hp.host);
  PS_RETURN_IF_ERROR(ValidateTlsConfig(options.tls));
  if (!options.tls.enabled() && !options.allow_insecure && !IsLoopbackHost(bind_host)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve plaintext on ", JoinHostPort(bind_host, hp.port), " (from ",
        options.address,
        "), which is not loopback: give --tls_ca_file, --tls_cert_file and "
        "--tls_key_file (deploy/tls/make_certs.sh makes them), or --allow_insecure to let "
        "anyone who reaches the port call anything"));
  }

  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(JoinHostPort(bind_host, hp.port), ServerCredentialsFor(options.tls),
                           &port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  if (options.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  }
  for (grpc::Service* service : services) builder.RegisterService(service);
  if (options.metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(options.metrics->RpcInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", JoinHostPort(bind_host, hp.port),
                     " (address in use, or not an address of this host?)"));
  }
  const std::string address = JoinHostPort(hp.host, port);
  auto host =
      std::unique_ptr<ServiceHost>(new ServiceHost(options, std::move(server), port, address));
  host->SetServing(false);
  if (!options.port_file.empty()) {
    PS_RETURN_IF_ERROR(WriteFileAtomically(options.port_file, absl::StrCat(port, "\n")));
  }
  return host;
}

ServiceHost::ServiceHost(const ServiceHostOptions& options, std::unique_ptr<grpc::Server> server,
                         int port, std::string address)
    : options_(options), server_(std::move(server)), port_(port), address_(std::move(address)) {}

ServiceHost::~ServiceHost() { Shutdown(); }

void ServiceHost::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

void ServiceHost::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    server_->GetHealthCheckService()->SetServingStatus(false);
  }
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::microseconds(absl::ToInt64Microseconds(options_.shutdown_grace)));
  server_->Wait();
}

}  // namespace pscluster
