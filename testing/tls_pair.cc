#include "testing/tls_pair.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <initializer_list>
#include <thread>

namespace pscluster {

SocketPair::SocketPair(int buffer_bytes) {
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd) != 0) {
    std::perror("socketpair");
    return;
  }
  for (int f : fd) {
    fcntl(f, F_SETFL, fcntl(f, F_GETFL, 0) | O_NONBLOCK);
    if (buffer_bytes > 0) {
      setsockopt(f, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
      setsockopt(f, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
    }
  }
}

SocketPair::~SocketPair() {
  for (int f : fd) {
    if (f >= 0) close(f);
  }
}

std::string CaptureWrites(SocketPair& pair, const std::function<absl::Status()>& write,
                          absl::Status* status) {
  std::thread writer([&] {
    *status = write();
    shutdown(pair.fd[0], SHUT_WR);
  });
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(pair.fd[1], buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) break;
    pollfd p{pair.fd[1], POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) break;
  }
  writer.join();
  return out;
}

TlsPair::TlsPair() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("test"), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509_sign(cert, key, EVP_sha256());
  SSL_CTX* server_ctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX* client_ctx = SSL_CTX_new(TLS_client_method());
  for (SSL_CTX* ctx : {server_ctx, client_ctx}) {
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_num_tickets(ctx, 0);
  }
  SSL_CTX_use_certificate(server_ctx, cert);
  SSL_CTX_use_PrivateKey(server_ctx, key);
  server_ = SSL_new(server_ctx);
  client_ = SSL_new(client_ctx);
  SSL_CTX_free(server_ctx);
  SSL_CTX_free(client_ctx);
  X509_free(cert);
  EVP_PKEY_free(key);
  SSL_set_fd(server_, handshake_.fd[0]);
  SSL_set_fd(client_, handshake_.fd[1]);
  SSL_set_accept_state(server_);
  SSL_set_connect_state(client_);
  // Both ends in this thread: step each until neither needs the other.
  for (int round = 0; round < 100; ++round) {
    const int s = SSL_do_handshake(server_);
    const int c = SSL_do_handshake(client_);
    if (s == 1 && c == 1) {
      ok_ = true;
      return;
    }
  }
  std::fprintf(stderr, "TlsPair: the TLS handshake did not complete\n");
}

TlsPair::~TlsPair() {
  SSL_free(client_);
  SSL_free(server_);
}

}  // namespace pscluster
