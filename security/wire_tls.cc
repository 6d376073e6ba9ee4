#include "security/wire_tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log_once.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

// The error OpenSSL queued last, in words ("" when none), and the queue cleared.
std::string OpenSslError() {
  std::string out;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    out = buf;  // the last is the most specific
  }
  return out;
}

// The files' modification times and sizes, to notice a rotation.
std::string Stamp(const TlsConfig& tls) {
  std::string stamp;
  for (const std::string* f : {&tls.ca_file, &tls.cert_file, &tls.key_file}) {
    struct stat st;
    if (stat(f->c_str(), &st) == 0) {
      absl::StrAppend(&stamp, st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ":", st.st_size, ";");
    } else {
      absl::StrAppend(&stamp, "missing;");
    }
  }
  return stamp;
}

int PollMillis(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

}  // namespace

void SslFree::operator()(ssl_st* ssl) const { SSL_free(ssl); }

absl::StatusOr<std::shared_ptr<WireTlsContext>> WireTlsContext::Create(const TlsConfig& tls,
                                                                       Side side, bool kernel_tls) {
  if (absl::Status valid = ValidateTlsConfig(tls); !valid.ok()) return valid;
  if (!tls.enabled()) {
    return absl::InvalidArgumentError("the tensor data plane's TLS needs the cluster's TLS files");
  }
  // OpenSSL writes to the socket with write(2): a peer that went away would end the process
  // with SIGPIPE. Every write's result is checked, so the process ignores the signal, as
  // servers do (the daemons' own writes use MSG_NOSIGNAL).
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { signal(SIGPIPE, SIG_IGN); });
  std::shared_ptr<WireTlsContext> context(new WireTlsContext(tls, side, kernel_tls));
  absl::MutexLock lock(&context->mu_);
  if (absl::Status loaded = context->Load(); !loaded.ok()) return loaded;
  return context;
}

WireTlsContext::~WireTlsContext() = default;

absl::Status WireTlsContext::Load() {
  const std::string stamp = Stamp(tls_);
  std::shared_ptr<SSL_CTX> ctx(
      SSL_CTX_new(side_ == Side::kServer ? TLS_server_method() : TLS_client_method()),
      SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslError());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), tls_.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load the certificate ", tls_.cert_file, ": ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), tls_.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load the key ", tls_.key_file, " for ",
                                                   tls_.cert_file, ": ", OpenSslError()));
  }
  if (SSL_CTX_load_verify_locations(ctx.get(), tls_.ca_file.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load the CA ", tls_.ca_file, ": ", OpenSslError()));
  }
  // Both sides verify: the server requires a certificate of the cluster's CA.
  SSL_CTX_set_verify(
      ctx.get(),
      side_ == Side::kServer ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER,
      nullptr);
  // Large tensors: writes of any size. No read-ahead until the admission is read
  // (WireSocket::AttachTls turns it on for TLS records): OpenSSL must not take bytes of the
  // sealed stream that follows into its own buffer. With it, reads take as many records as
  // have arrived in one system call, into a 128 KiB buffer.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_default_read_buffer_len(ctx.get(), 128 << 10);
  // AES-128-GCM first: as strong as the data plane needs, and a third cheaper than AES-256.
  SSL_CTX_set_ciphersuites(ctx.get(),
                           "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(ctx.get(), 0);
#ifdef SSL_OP_ENABLE_KTLS
  if (kernel_tls_) SSL_CTX_set_options(ctx.get(), SSL_OP_ENABLE_KTLS);
#endif
  ctx_ = std::move(ctx);
  loaded_stamp_ = stamp;
  checked_ = absl::Now();
  return absl::OkStatus();
}

std::shared_ptr<SSL_CTX> WireTlsContext::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ >= absl::Seconds(std::max(1, tls_.refresh_interval_s))) {
    checked_ = now;
    if (Stamp(tls_) != loaded_stamp_) {
      // A rotation in progress may leave a key that does not match its certificate for a
      // moment: the old context serves until the files agree again.
      if (absl::Status reloaded = Load(); !reloaded.ok()) {
        PS_LOG_FIRST_N(WARNING, 10) << "tensor data plane: keeping the old TLS files: " << reloaded;
      }
    }
  }
  return ctx_;
}

absl::StatusOr<SslPtr> WireTlsContext::Handshake(int fd, const std::string& server_name,
                                                 absl::Duration timeout) {
  const std::shared_ptr<SSL_CTX> ctx = Current();
  SslPtr ssl(SSL_new(ctx.get()));
  if (ssl == nullptr) return absl::InternalError("SSL_new: " + OpenSslError());
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  if (SSL_set_fd(ssl.get(), fd) != 1) return absl::InternalError("SSL_set_fd: " + OpenSslError());
  if (side_ == Side::kClient) {
    std::string host = server_name;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
    unsigned char ip[16];
    const bool is_ip =
        inet_pton(AF_INET, host.c_str(), ip) == 1 || inet_pton(AF_INET6, host.c_str(), ip) == 1;
    const int named = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str())
                            : X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size());
    if (named != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot expect the name ", host, ": ", OpenSslError()));
    }
    if (!is_ip) SSL_set_tlsext_host_name(ssl.get(), host.c_str());
    SSL_set_connect_state(ssl.get());
  } else {
    SSL_set_accept_state(ssl.get());
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl.get());
    if (r == 1) break;
    const int err = SSL_get_error(ssl.get(), r);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      pollfd p{fd, static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
      const int ready = poll(&p, 1, PollMillis(deadline));
      if (ready == 0) return absl::DeadlineExceededError("the TLS handshake timed out");
      if (ready < 0 && errno != EINTR) {
        return absl::UnavailableError(absl::StrCat("TLS handshake: ", std::strerror(errno)));
      }
      continue;
    }
    const long verified = SSL_get_verify_result(ssl.get());
    const std::string why = OpenSslError();
    if (verified != X509_V_OK) {
      return absl::UnauthenticatedError(absl::StrCat("the TLS peer's certificate does not verify: ",
                                                     X509_verify_cert_error_string(verified)));
    }
    if (!why.empty()) {
      return absl::UnauthenticatedError(absl::StrCat("TLS handshake refused: ", why));
    }
    return absl::UnavailableError("the peer closed the connection during the TLS handshake");
  }
  if (SSL_get_verify_result(ssl.get()) != X509_V_OK) {
    return absl::UnauthenticatedError("the TLS peer's certificate does not verify");
  }
  X509* peer = SSL_get1_peer_certificate(ssl.get());
  if (peer == nullptr) return absl::UnauthenticatedError("the TLS peer sent no certificate");
  X509_free(peer);
  return ssl;
}

namespace {

constexpr char kAdmissionMagic[] = "PSWT";
constexpr int kAdmissionBytes = 8;

// Waits for the socket as the failed SSL call `r` asks; an error status when it failed for
// good (`what` names the step).
absl::Status AwaitSsl(ssl_st* ssl, int r, absl::Time deadline, const char* what) {
  const int err = SSL_get_error(ssl, r);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    pollfd p{SSL_get_fd(ssl), static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
    const int ready = poll(&p, 1, PollMillis(deadline));
    if (ready == 0) return absl::DeadlineExceededError(absl::StrCat(what, " timed out"));
    if (ready < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  const std::string why = OpenSslError();
  if (err == SSL_ERROR_SSL && !why.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("TLS handshake refused: ", why));
  }
  return absl::UnavailableError(
      absl::StrCat("the peer closed the connection during ", what,
                   err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL
                       ? " (a ps does that when the certificate's identity may not use it)"
                       : ""));
}

}  // namespace

absl::Status WireTlsContext::Admit(ssl_st* ssl, bool sealed, absl::Duration timeout) {
  char admission[kAdmissionBytes] = {'P', 'S', 'W', 'T', 1, sealed ? 'S' : 'R', 0, 0};
  const absl::Time deadline = absl::Now() + timeout;
  size_t sent = 0;
  while (sent < sizeof(admission)) {
    ERR_clear_error();
    size_t n = 0;
    const int r = SSL_write_ex(ssl, admission + sent, sizeof(admission) - sent, &n);
    if (r == 1) {
      sent += n;
      continue;
    }
    if (absl::Status s = AwaitSsl(ssl, r, deadline, "the data plane's admission"); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> WireTlsContext::AwaitAdmission(ssl_st* ssl, absl::Duration timeout) {
  char admission[kAdmissionBytes];
  const absl::Time deadline = absl::Now() + timeout;
  size_t got = 0;
  while (got < sizeof(admission)) {
    ERR_clear_error();
    size_t n = 0;
    const int r = SSL_read_ex(ssl, admission + got, sizeof(admission) - got, &n);
    if (r == 1) {
      got += n;
      continue;
    }
    if (absl::Status s = AwaitSsl(ssl, r, deadline, "the data plane's admission"); !s.ok()) {
      return s;
    }
  }
  if (std::memcmp(admission, kAdmissionMagic, 4) != 0 || admission[4] != 1 ||
      (admission[5] != 'S' && admission[5] != 'R')) {
    return absl::InvalidArgumentError(
        "the data port's admission is not one this version understands (expected \"PSWT\", "
        "version 1): a ps of another version?");
  }
  return admission[5] == 'S';
}

absl::StatusOr<PeerIdentity> PeerIdentityOf(const ssl_st* ssl, const std::string& cluster) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return absl::UnauthenticatedError("the TLS peer sent no certificate");
  std::vector<std::string> uris;
  for (std::string& uri : CertificateUris(cert)) {
    if (absl::StartsWith(uri, "spiffe://")) uris.push_back(std::move(uri));
  }
  X509_free(cert);
  if (uris.size() != 1) {
    return absl::UnauthenticatedError(absl::StrCat("the peer's certificate names ", uris.size(),
                                                   " spiffe:// URIs; expected one, of cluster \"",
                                                   cluster, "\""));
  }
  absl::StatusOr<PeerIdentity> id = ParsePeerUri(uris[0]);
  if (!id.ok()) return absl::UnauthenticatedError(id.status().message());
  if (id->cluster != cluster) {
    return absl::UnauthenticatedError(absl::StrCat("the caller's certificate names ", uris[0],
                                                   ", not a member of cluster \"", cluster, "\""));
  }
  return id;
}

bool KernelTlsSend(ssl_st* ssl) {
#ifndef OPENSSL_NO_KTLS
  return BIO_get_ktls_send(SSL_get_wbio(ssl));
#else
  (void)ssl;
  return false;
#endif
}

bool KernelTlsReceive(ssl_st* ssl) {
#ifndef OPENSSL_NO_KTLS
  return BIO_get_ktls_recv(SSL_get_rbio(ssl));
#else
  (void)ssl;
  return false;
#endif
}

}  // namespace pscluster
