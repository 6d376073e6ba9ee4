#ifndef PSCLUSTER_SECURITY_TLS_H_
#define PSCLUSTER_SECURITY_TLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "security/identity.h"

struct x509_st;  // OpenSSL's X509

namespace pscluster {

// Mutual TLS for every gRPC channel of the cluster: each process has a certificate and key
// signed by the cluster's CA and trusts only that CA. Servers require and verify the client's
// certificate; clients verify the server's (chain and host name). The files are watched and
// reloaded when they change, so certificates can be rotated without a restart.
struct TlsConfig {
  // PEM files. All three empty: plaintext.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // How often the files are checked for changes, in seconds.
  int refresh_interval_s = 60;

  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// OK when the three files are all given (or all empty) and readable.
absl::Status ValidateTlsConfig(const TlsConfig& tls);

// Server credentials: mutual TLS when enabled (client certificates required and verified
// against ca_file), plaintext otherwise.
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const TlsConfig& tls);

// Channel credentials: TLS with this process's certificate when enabled, plaintext otherwise.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TlsConfig& tls);

// The URIs (spiffe:// among them) in the subject alternative names of the PEM certificate at
// `cert_file`.
absl::StatusOr<std::vector<std::string>> CertificateUris(const std::string& cert_file);
// The same of a parsed certificate (OpenSSL's X509): every URI subject alternative name.
std::vector<std::string> CertificateUris(const x509_st* cert);

// This process's identity: the one spiffe:// URI of its certificate, parsed (identity.h).
absl::StatusOr<PeerIdentity> OwnIdentity(const TlsConfig& tls);

}  // namespace pscluster

#endif  // PSCLUSTER_SECURITY_TLS_H_
