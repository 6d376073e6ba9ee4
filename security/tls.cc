#include "security/tls.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace pscluster {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;

std::shared_ptr<FileWatcherCertificateProvider> ProviderFor(const TlsConfig& tls) {
  return std::make_shared<FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.ca_file,
      static_cast<unsigned int>(std::max(1, tls.refresh_interval_s)));
}

}  // namespace

absl::Status ValidateTlsConfig(const TlsConfig& tls) {
  if (!tls.enabled()) return absl::OkStatus();
  const std::pair<const char*, const std::string*> files[] = {
      {"--tls_ca_file", &tls.ca_file},
      {"--tls_cert_file", &tls.cert_file},
      {"--tls_key_file", &tls.key_file},
  };
  for (const auto& [flag, path] : files) {
    if (path->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TLS needs --tls_ca_file, --tls_cert_file and --tls_key_file together; ",
                       flag, " is missing"));
    }
    if (access(path->c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, "=", *path, ": cannot read the file"));
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const TlsConfig& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(ProviderFor(tls));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const TlsConfig& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(ProviderFor(tls));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

absl::StatusOr<std::vector<std::string>> CertificateUris(const std::string& cert_file) {
  BIO* bio = BIO_new_file(cert_file.c_str(), "r");
  if (bio == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot open certificate ", cert_file));
  }
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(cert_file, " does not hold a PEM certificate"));
  }
  std::vector<std::string> uris = CertificateUris(cert);
  X509_free(cert);
  return uris;
}

std::vector<std::string> CertificateUris(const x509_st* cert) {
  std::vector<std::string> uris;
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    uris.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                      static_cast<size_t>(ASN1_STRING_length(uri)));
  }
  GENERAL_NAMES_free(names);
  return uris;
}

absl::StatusOr<PeerIdentity> OwnIdentity(const TlsConfig& tls) {
  absl::StatusOr<std::vector<std::string>> uris = CertificateUris(tls.cert_file);
  if (!uris.ok()) return uris.status();
  std::vector<std::string> spiffe;
  for (const std::string& uri : *uris) {
    if (absl::StartsWith(uri, "spiffe://")) spiffe.push_back(uri);
  }
  if (spiffe.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("certificate ", tls.cert_file,
                     " must name exactly one spiffe:// URI in its subject "
                     "alternative names (deploy/tls/make_certs.sh writes them); it has ",
                     spiffe.empty() ? std::string("none") : absl::StrJoin(spiffe, ", ")));
  }
  absl::StatusOr<PeerIdentity> id = ParsePeerUri(spiffe[0]);
  if (!id.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("certificate ", tls.cert_file, ": ", id.status().message()));
  }
  return id;
}

}  // namespace pscluster
