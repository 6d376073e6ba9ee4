#ifndef PSCLUSTER_COMMON_SEALED_CHANNEL_H_
#define PSCLUSTER_COMMON_SEALED_CHANNEL_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct ssl_st;  // OpenSSL's SSL

namespace pscluster {

class ThreadPool;

// The tensor data plane's encryption after a mutual TLS 1.3 handshake (security/wire_tls.h):
// the bytes go in sealed chunks of AES-128-GCM, keyed from the handshake, instead of OpenSSL's
// 16 KiB TLS records. Large tensors are what the data plane moves, and the record layer costs
// them twice: a copy between the caller's buffer and OpenSSL's on each side besides the
// cipher, and one thread per connection doing all of it. A sealed chunk is encrypted straight
// from the caller's buffer into the bytes sent, decrypted straight from the bytes received into
// the caller's buffer (a dense shard, a pull's output), and the chunks of one large write or
// read are sealed and opened on several cores at once where the machine has them.
// The cipher is common/aes_gcm.h's: Intel's libipsec-mb where the CPU has AES-NI (4x
// OpenSSL 3.0's speed with AVX-512 VAES), OpenSSL otherwise.
//
// The keys: TLS 1.3's exporter (RFC 8446 section 7.5, SSL_export_keying_material) with the
// label "EXPORTER-pscluster-tensor-wire" and a context of the sending side ('c' client,
// 's' server) and the key epoch, 28 bytes: a 16-byte AES key and a 12-byte IV. Each side sends
// with its own key; the exporter binds both to this handshake, so only the two authenticated
// peers have them. A new epoch (new keys) begins every 2^20 chunks of one direction (at most
// 128 GiB), well within AES-GCM's limits for one key.
//
// A chunk on the wire: a 4-byte little-endian plaintext length L (1 to kMaxChunkBytes), then
// L bytes of ciphertext, then a 16-byte GCM tag. The nonce is the IV XOR the chunk's sequence
// number within its epoch in the last 8 bytes (big-endian), as TLS 1.3 forms it; the length is
// the additional authenticated data. The sequence number is implicit, so a chunk dropped,
// repeated, reordered or moved to another connection or direction fails to authenticate, and
// the connection is finished (DATA_LOSS) at the first such chunk.
//
// Thread-compatible: one reader and one writer at a time (not concurrently with each other
// either: a connection carries one request at a time).
class SealedChannel {
 public:
  static constexpr int64_t kMaxChunkBytes = 128 << 10;
  static constexpr int kHeaderBytes = 4;
  static constexpr int kTagBytes = 16;

  // `ssl`: a TLS 1.3 connection whose handshake completed on the connected socket `fd`; it
  // must outlive the channel (later key epochs are exported from it) and must not read from or
  // write to the socket again. INTERNAL when the keys cannot be exported.
  // `epoch_chunks_log2`: new keys every 2^that chunks (tests make it small).
  static absl::StatusOr<std::unique_ptr<SealedChannel>> Create(int fd, ssl_st* ssl,
                                                               int epoch_chunks_log2 = 20);
  ~SealedChannel();

  // Sends every byte of the buffers, sealed, in chunks of 48 KiB (PSCLUSTER_SEAL_CHUNK_BYTES:
  // 4 KiB to kMaxChunkBytes). Buffers of 48 KiB or more start chunks of their own, so that the
  // peer can open them straight into a buffer of the same size.
  absl::Status Write(const struct iovec* iov, int count, absl::Time deadline);
  // Seals the buffers as Write would, for a caller that must not wait on the socket while it
  // holds something (a shard's lock) and whose buffers may change once it lets go: each chunk
  // goes out as soon as it is sealed while the socket takes it without waiting, and the sealed
  // bytes it does not take are kept for Flush, which sends them. Never waits on the socket.
  // A Write first sends what is kept.
  absl::Status Stage(const struct iovec* iov, int count);
  absl::Status Flush(absl::Time deadline);
  // Sealed bytes kept, not sent yet.
  size_t staged_bytes() const { return staged_bytes_ - staged_sent_; }

  // Receives exactly n bytes, opened.
  absl::Status Read(char* out, int64_t n, absl::Time deadline);
  // Whether opened bytes are waiting (a chunk that was larger than a read).
  bool HasBuffered() const { return buffered_pos_ < buffered_.size(); }

  // The threads that seal and open the chunks of one call beside the calling thread, which
  // sends each chunk as soon as it is sealed and hands each one received to them while it
  // receives the next: 0 on machines of fewer than 8 cores (the caller does it all: there the
  // connections' threads already keep every core busy, and waking helpers cost more than it
  // gave in bench/ps.sh), else 2 with libipsec-mb's cipher and a quarter of the cores, 2 to
  // 8, with OpenSSL's. PSCLUSTER_SEAL_THREADS (0 to 64) overrides it; another value is logged
  // and ignored. Shared by every channel of the process, and they help a call only while the
  // process has at most one more call under way than helpers (with more, the calling threads
  // already fill the cores); they spin a little between chunks before they sleep
  // (PSCLUSTER_SEAL_SPIN=0: they sleep at once).
  //
  // Whatever the threads, the calling thread does not wait idle: while the socket's buffer is
  // full it seals the chunks that follow, and while nothing has arrived it opens the chunks
  // that did. A read receives as many bytes as have arrived at once (never past its own last
  // chunk, so the next read's bytes stay in the socket).
  static int ParallelThreads();

  // The plaintext bytes of the chunks a writer cuts (a reader takes any size up to
  // kMaxChunkBytes): kDefaultChunkBytes, or PSCLUSTER_SEAL_CHUNK_BYTES (kMinChunkBytes to
  // kMaxChunkBytes; another value is logged and the default kept).
  static constexpr size_t kDefaultChunkBytes = 48 << 10;
  static constexpr size_t kMinChunkBytes = 4 << 10;
  static size_t WriteChunkBytes();
  // PSCLUSTER_SEAL_CHUNK_BYTES's value (null or empty: unset) as WriteChunkBytes takes it;
  // INVALID_ARGUMENT naming the value and the range for anything but a byte count in range.
  static absl::StatusOr<size_t> ParseChunkBytes(const char* value);

  // The chunks this process's channels sealed and opened so far, by the threads that called
  // them and by the pool's (ParallelThreads): how the work was shared out, for benchmarks.
  struct WorkSplit {
    int64_t sealed_by_caller = 0;
    int64_t sealed_by_pool = 0;
    int64_t opened_by_caller = 0;
    int64_t opened_by_pool = 0;
  };
  static WorkSplit Split();
  // Writes, stages and reads under way in this process now, on any channel (for tests).
  static int CallsUnderWay();

  struct Key {
    unsigned char key[16];
    unsigned char iv[12];
  };

 private:
  // One direction: its sequence number and the keys of its current epoch.
  struct Direction {
    char sender = 0;  // 'c' or 's'
    uint64_t seq = 0;
    uint64_t epoch = ~uint64_t{0};
    Key key;
  };
  SealedChannel(int fd, ssl_st* ssl, bool is_server, int epoch_chunks_log2);
  // The key for direction d's next chunk (a new epoch's exported when it begins); the
  // chunk's sequence number within its epoch in *seq.
  absl::Status NextKey(Direction* d, Key* key, uint64_t* seq);

  const int fd_;
  ssl_st* const ssl_;
  ThreadPool* const pool_;  // null: the caller seals and opens every chunk
  const int epoch_shift_;
  Direction send_;
  Direction receive_;
  absl::Status broken_;         // once a call fails midway, every later one does
  std::vector<char> send_buf_;  // sealed chunks on their way out
  std::vector<char> staged_;    // Stage's sealed chunks: the first staged_bytes_ bytes,
  size_t staged_bytes_ = 0;     // of which the first staged_sent_ have gone out
  size_t staged_sent_ = 0;
  std::vector<char> receive_buf_;
  std::vector<char> buffered_;  // the opened rest of a chunk larger than the read that took it
  size_t buffered_pos_ = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_SEALED_CHANNEL_H_
