#ifndef PSCLUSTER_COMMON_TENSOR_WIRE_H_
#define PSCLUSTER_COMMON_TENSOR_WIRE_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/sealed_channel.h"

struct ssl_st;  // OpenSSL's SSL

namespace pscluster {

// The tensor data plane: pulls and pushes of dense shards and sparse rows over a plain TCP
// connection to a ps task, beside its gRPC service (which stays the control plane: creation,
// inspection, checkpoints). Its messages are those of proto/ps_service.proto; only the
// framing is new, so that tensors go from the socket into shard memory with no serialization
// step and no per-message copy (docs/wire.md has the measurements that chose it).
//
// A connection carries one request at a time: the client writes a request frame, the server
// answers with one response frame. A frame is a fixed 32-byte header, then `meta_bytes` of a
// serialized protobuf message, then `payload_bytes` of raw little-endian data:
//
//   offset  size  field
//        0     4  magic "PSW1"
//        4     2  op (WireOp); a response has the request's op | kResponseBit
//        6     2  flags (0)
//        8     4  status: a response's google.rpc / absl status code (0 = OK); 0 in requests
//       12     4  meta_bytes
//       16     8  payload_bytes
//       24     8  tag: any value; the response carries the request's
//
// Requests (meta; payload):
//   kPullDense    PullDenseRequest;            none
//   kPushDense    PushDenseHeader;             each shard's gradient, in order, in wire dtype
//   kPullSparse   PullSparseRequest (no keys); the keys, int64 each
//   kPushSparse   PushSparseRequest (no keys or gradients, num_keys set); the keys, int64 each,
//                 then num_keys * dim gradient elements in wire dtype
//   kReplicate    ReplicateHeader (a primary ps task's forward to the backup of its shards,
//                 issue 37); each shard's gradient, in order, float32
//   kReplicateStream  ReplicateHeader without versions or outcome (a forward sent while the
//                 primary still receives the push); the gradients as kReplicate's. No answer:
//                 the next frame on the connection must be its kReplicateCommit
//   kReplicateCommit  ReplicateHeader (versions, accepted, dropped_stale: the rest is the
//                 stream's); none. Answered as kReplicate. A connection closed before it
//                 abandons the stream's forward (nothing applied)
//   kReplicateSparse  ReplicateSparseRequest without keys or gradients (a primary's forward of
//                 a table push to a backup task); the keys (as many as its groups count),
//                 int64 each, then their gradients, float32
// Responses with status 0 (meta; payload):
//   kPullDense    none;                the shards' values, in order, in wire dtype
//   kPushDense    PushDenseResponse;   none
//   kPullSparse   none;                the rows, in the order of the keys, in wire dtype
//   kPushSparse   PushSparseResponse;  none
//   kReplicate    ReplicateResponse;   none
//   kReplicateCommit  ReplicateResponse; none
//   kReplicateSparse  ReplicateSparseResponse; none
// A response with a non-zero status has the error message (UTF-8) as meta and no payload. A
// request the server cannot frame (bad magic, sizes over its limits) gets such a response and
// the connection is closed; any other refused request leaves the connection usable.
enum class WireOp : uint16_t {
  kPullDense = 1,
  kPushDense = 2,
  kPullSparse = 3,
  kPushSparse = 4,
  kReplicate = 5,
  kReplicateStream = 6,
  kReplicateCommit = 7,
  kReplicateSparse = 8,
};
constexpr uint16_t kResponseBit = 0x8000;
constexpr uint32_t kFrameMagic = 0x31575350;  // "PSW1" read as a little-endian uint32
constexpr int kFrameHeaderBytes = 32;

struct FrameHeader {
  uint16_t op = 0;
  uint16_t flags = 0;
  uint32_t status = 0;
  uint32_t meta_bytes = 0;
  uint64_t payload_bytes = 0;
  uint64_t tag = 0;
};

// Writes `header` into out[0, kFrameHeaderBytes).
void EncodeFrameHeader(const FrameHeader& header, char* out);
// INVALID_ARGUMENT when the bytes do not start with the magic.
absl::StatusOr<FrameHeader> DecodeFrameHeader(const char* in);

// "PullDense", "PushDense", ..., or "op N" for an unknown value (the response bit ignored).
std::string WireOpName(uint16_t op);

// A connected TCP socket, owned: closed by the destructor. Blocking I/O with a timeout per call
// (DEADLINE_EXCEEDED when it passes); a peer that went away is UNAVAILABLE. With TLS attached
// (AttachTls, after security/wire_tls.h's handshake) every byte goes through it, encrypted
// from and decrypted into the caller's buffers. Thread-compatible; Shutdown() may be called
// from another thread to make blocked calls return.
class WireSocket {
 public:
  explicit WireSocket(int fd) : fd_(fd) {}
  ~WireSocket();
  WireSocket(const WireSocket&) = delete;
  WireSocket& operator=(const WireSocket&) = delete;

  // Connects to host:port within `timeout`, with TCP_NODELAY and the given socket buffer
  // sizes (0: the system's). UNAVAILABLE naming the address when nothing answers.
  static absl::StatusOr<std::unique_ptr<WireSocket>> Connect(const std::string& host, int port,
                                                             absl::Duration timeout,
                                                             int buffer_bytes);

  int fd() const { return fd_; }

  // From now on every read and write goes through the TLS connection `ssl` (an OpenSSL SSL*
  // whose handshake on this socket completed), which the socket takes and frees: in sealed
  // chunks keyed from it (common/sealed_channel.h) with `sealed`, else in its TLS records
  // (encrypted by the kernel where kTLS took). Both ends must agree (security/wire_tls.h's
  // admission says which). INTERNAL when the sealed keys cannot be derived.
  absl::Status AttachTls(ssl_st* ssl, bool sealed);
  struct ssl_st* tls() const {
    return ssl_;
  }

  // Sends every byte of the buffers, in order.
  absl::Status WriteAll(struct iovec* iov, int count, absl::Duration timeout);
  absl::Status Write(absl::string_view bytes, absl::Duration timeout);
  // As WriteAll, except in sealed chunks: there the buffers are sealed now (they may change
  // once it returns) and sent as they are sealed while the socket takes them without waiting;
  // what it does not take is kept until Flush, up to MaxStagedBytes() (past that they go out
  // at once, waiting). For a writer holding a lock that the sending should not hold.
  // MaxStagedBytes() is kMaxStagedBytes, or PSCLUSTER_SEAL_STAGE_BYTES when set (0: nothing is
  // kept, Stage waits on the socket as WriteAll does).
  static constexpr size_t kMaxStagedBytes = 16 << 20;
  static size_t MaxStagedBytes();
  absl::Status Stage(struct iovec* iov, int count, absl::Duration timeout);
  absl::Status Flush(absl::Duration timeout);
  // Receives exactly n bytes.
  absl::Status ReadExact(void* out, int64_t n, absl::Duration timeout);
  // Receives and drops n bytes.
  absl::Status Discard(int64_t n, absl::Duration timeout);
  // Waits until a byte can be read, the peer closes, or `timeout` passes (DEADLINE_EXCEEDED).
  // infinite timeout: no limit.
  absl::Status AwaitReadable(absl::Duration timeout);

  // Makes blocked and later calls fail. Safe from any thread.
  void Shutdown();

 private:
  // The TLS forms of the reads and writes.
  absl::Status TlsWrite(const char* data, size_t n, absl::Time deadline);
  absl::Status TlsRead(char* out, int64_t n, absl::Time deadline);

  const int fd_;
  ssl_st* ssl_ = nullptr;                  // Owned; null without TLS.
  std::unique_ptr<SealedChannel> sealed_;  // with TLS in sealed chunks
  std::string coalesced_;                  // TLS: small buffers gathered into one record
};

// Sets TCP_NODELAY and the send and receive buffers (0: leave them) of a connected socket.
void ConfigureWireSocket(int fd, int buffer_bytes);

// An error frame's parts: absl::Status <-> (status, meta).
absl::Status WireErrorStatus(uint32_t code, absl::string_view message);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_TENSOR_WIRE_H_
