#ifndef PSCLUSTER_TESTING_TLS_PAIR_H_
#define PSCLUSTER_TESTING_TLS_PAIR_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"

struct ssl_st;  // OpenSSL's SSL

namespace pscluster {

// A connected pair of non-blocking AF_UNIX stream sockets, closed at the end. `buffer_bytes`
// > 0 sets both ends' send and receive buffers (so that a test can write that much before
// anyone reads).
struct SocketPair {
  explicit SocketPair(int buffer_bytes = 0);
  ~SocketPair();
  SocketPair(const SocketPair&) = delete;
  SocketPair& operator=(const SocketPair&) = delete;
  int fd[2] = {-1, -1};
};

// Runs `write` on a thread of its own (it writes into pair.fd[0]) and returns every byte that
// came out of pair.fd[1] until it returned and the write end was shut; *status is what `write`
// returned. Gives up waiting for bytes after 10 s without any.
std::string CaptureWrites(SocketPair& pair, const std::function<absl::Status()>& write,
                          absl::Status* status);

// A TLS 1.3 client and server that completed a handshake over a socket pair of their own, with
// a throwaway self-signed certificate: for tests of what runs after a handshake with the keys
// it exported (common/sealed_channel.h). tests/tls_test.cc has the cluster's certificates and
// their checks. ok() is false (and a message on stderr) when the handshake failed.
class TlsPair {
 public:
  TlsPair();
  ~TlsPair();
  TlsPair(const TlsPair&) = delete;
  TlsPair& operator=(const TlsPair&) = delete;

  bool ok() const { return ok_; }
  ssl_st* client() const { return client_; }
  ssl_st* server() const { return server_; }

 private:
  SocketPair handshake_;
  ssl_st* client_ = nullptr;
  ssl_st* server_ = nullptr;
  bool ok_ = false;
};

}  // namespace pscluster

#endif  // PSCLUSTER_TESTING_TLS_PAIR_H_
