#ifndef PSCLUSTER_SECURITY_WIRE_TLS_H_
#define PSCLUSTER_SECURITY_WIRE_TLS_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "security/identity.h"
#include "security/tls.h"

struct ssl_st;
struct ssl_ctx_st;

namespace pscluster {

// Owns an OpenSSL connection (SSL*).
struct SslFree {
  void operator()(ssl_st* ssl) const;
};
using SslPtr = std::unique_ptr<ssl_st, SslFree>;

// Mutual TLS for the tensor data plane (common/tensor_wire.h), with the cluster's certificate
// files (TlsConfig), as gRPC's channels use them: TLS 1.3 only; the server requires a client
// certificate that chains to ca_file; the client verifies the server's chain and that its
// certificate names the host it dialed (a DNS name or an IP address). The files are looked at
// again every refresh_interval_s and the context rebuilt when one changed, so certificates
// rotate without a restart (connections already open keep theirs).
//
// With `kernel_tls`, the record encryption of an established connection is handed to the
// kernel (Linux kTLS, OpenSSL's SSL_OP_ENABLE_KTLS) where the kernel and the cipher allow;
// otherwise OpenSSL encrypts in user space. (A server with it admits its clients to TLS
// records; without it, to sealed chunks.) Thread-safe. The first Create() makes the process
// ignore SIGPIPE (OpenSSL writes with write(2); a peer gone would otherwise kill the process).
class WireTlsContext {
 public:
  enum class Side { kServer, kClient };

  // INVALID_ARGUMENT naming the file when a certificate, key or CA cannot be loaded, or the key
  // does not match the certificate.
  static absl::StatusOr<std::shared_ptr<WireTlsContext>> Create(const TlsConfig& tls, Side side,
                                                                bool kernel_tls = false);
  ~WireTlsContext();

  // Runs the handshake on the connected socket `fd` (made non-blocking) within `timeout`.
  // `server_name`: the client's expected host (ignored by the server). UNAUTHENTICATED naming
  // the reason when the peer's certificate is missing or does not verify; UNAVAILABLE when the
  // peer goes away; DEADLINE_EXCEEDED.
  absl::StatusOr<SslPtr> Handshake(int fd, const std::string& server_name, absl::Duration timeout);

  // After the handshake, the server admits the client (once its identity passed): it says
  // which framing the connection's bytes take from here on, sealed chunks
  // (common/sealed_channel.h) or TLS records, in one TLS record of 8 bytes ("PSWT", version 1,
  // 'S' or 'R', two zero bytes). The client must not send before it has read it, so nothing
  // of the sealed stream can reach OpenSSL's buffers.
  absl::Status Admit(ssl_st* ssl, bool sealed, absl::Duration timeout);
  // The client's side: whether the server chose sealed chunks. UNAUTHENTICATED naming the
  // reason when the server refused this client's certificate (its alert), UNAVAILABLE when it
  // closed the connection without a word (it refused the identity), INVALID_ARGUMENT when the
  // admission is not one this version understands.
  absl::StatusOr<bool> AwaitAdmission(ssl_st* ssl, absl::Duration timeout);

  Side side() const { return side_; }

 private:
  WireTlsContext(TlsConfig tls, Side side, bool kernel_tls)
      : tls_(std::move(tls)), side_(side), kernel_tls_(kernel_tls) {}
  // A new SSL_CTX from the files, and their modification times.
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The context to start a connection with, rebuilt first when a file changed.
  std::shared_ptr<ssl_ctx_st> Current();

  const TlsConfig tls_;
  const Side side_;
  const bool kernel_tls_;
  absl::Mutex mu_;
  std::shared_ptr<ssl_ctx_st> ctx_ ABSL_GUARDED_BY(mu_);
  std::string loaded_stamp_ ABSL_GUARDED_BY(mu_);  // the files' mtimes and sizes
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
};

// The identity in the verified certificate of a TLS peer: its one spiffe:// URI, parsed.
// UNAUTHENTICATED when it has none (or several) or names another cluster than `cluster`.
absl::StatusOr<PeerIdentity> PeerIdentityOf(const ssl_st* ssl, const std::string& cluster);

// Whether the connection's record encryption runs in the kernel (kTLS), sending and
// receiving.
bool KernelTlsSend(ssl_st* ssl);
bool KernelTlsReceive(ssl_st* ssl);

}  // namespace pscluster

#endif  // PSCLUSTER_SECURITY_WIRE_TLS_H_
