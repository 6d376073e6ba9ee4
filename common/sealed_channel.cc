#include "common/sealed_channel.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/internal/endian.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/aes_gcm.h"
#include "common/log_once.h"
#include "common/socket_io.h"
#include "common/thread_pool.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

constexpr char kExporterLabel[] = "EXPORTER-pscluster-tensor-wire";
// Buffers from this size on start chunks of their own (see Write).
constexpr size_t kOwnChunkBytes = 64 << 10;
// The chunks one call seals or opens at once: 2 MiB.
constexpr int kBatchChunks = 16;
constexpr int64_t kSealedMax =
    SealedChannel::kHeaderBytes + SealedChannel::kMaxChunkBytes + SealedChannel::kTagBytes;

void Nonce(const SealedChannel::Key& key, uint64_t seq, unsigned char nonce[12]) {
  std::memcpy(nonce, key.iv, 12);
  for (int i = 0; i < 8; ++i) nonce[11 - i] ^= static_cast<unsigned char>(seq >> (8 * i));
}

using Piece = aes_gcm::Piece;

// One chunk of a call: its pieces (writing) or destination (reading), its key and number.
struct Chunk {
  int first_piece = 0;
  int num_pieces = 0;
  uint32_t size = 0;       // plaintext bytes
  char* sealed = nullptr;  // header, ciphertext, tag
  char* plain = nullptr;   // reading: where the opened bytes go
  SealedChannel::Key key;
  uint64_t seq = 0;
  bool ok = false;
};

// Seals `chunk` (its pieces) into chunk.sealed: the header (the additional authenticated
// data), the ciphertext, the tag.
bool Seal(Chunk& chunk, const Piece* pieces) {
  unsigned char nonce[12];
  Nonce(chunk.key, chunk.seq, nonce);
  unsigned char* out = reinterpret_cast<unsigned char*>(chunk.sealed);
  absl::little_endian::Store32(out, chunk.size);
  unsigned char* ciphertext = out + SealedChannel::kHeaderBytes;
  return aes_gcm::Seal(aes_gcm::DefaultEngine(), chunk.key.key, nonce, out,
                       SealedChannel::kHeaderBytes, pieces + chunk.first_piece, chunk.num_pieces,
                       ciphertext, ciphertext + chunk.size);
}

// Opens chunk.sealed into chunk.plain; false when it does not authenticate.
bool Open(const Chunk& chunk) {
  unsigned char nonce[12];
  Nonce(chunk.key, chunk.seq, nonce);
  const unsigned char* in = reinterpret_cast<const unsigned char*>(chunk.sealed);
  const unsigned char* ciphertext = in + SealedChannel::kHeaderBytes;
  return aes_gcm::Open(aes_gcm::DefaultEngine(), chunk.key.key, nonce, in,
                       SealedChannel::kHeaderBytes, ciphertext, chunk.size, ciphertext + chunk.size,
                       reinterpret_cast<unsigned char*>(chunk.plain));
}

// Chunks sealed and opened by the calling threads and by the pool's (SealedChannel::Split),
// added once per call (Crew::Finish), not per chunk.
std::atomic<int64_t> g_split[4];

ThreadPool* SharedPool() {
  static ThreadPool* const pool = [] {
    const int n = SealedChannel::ParallelThreads();
    // The chunks of a call come microseconds apart (one per 128 KiB received), and a step's
    // calls a fraction of a millisecond apart: threads that went to sleep would be woken for
    // each. PSCLUSTER_SEAL_SPIN=0 lets them sleep at once.
    const char* spin = std::getenv("PSCLUSTER_SEAL_SPIN");
    return n > 0 ? new ThreadPool(n, /*spin=*/spin == nullptr || std::strcmp(spin, "0") != 0)
                 : nullptr;
  }();
  return pool;
}

// Writes, stages and reads under way in this process, on any channel. The pool's threads help
// a call only while there are at most one more of them than helpers: with more at once (the 8
// stripes of a large pull, several clients of a ps) the calling threads already keep the cores
// busy, and helpers shared by all of them cost more in hand-offs than they seal
// (docs/benchmarks.md, the GPU machine's 16 cores, one call: 16 and 64 MiB pulls in 8 stripes
// sealed 12.2 / 11.8 GB/s with 2 helpers for every call, 16.6 / 15.3 with helpers for a lone
// call only; a 1 MiB pull in 2 stripes the other way round, 5.72 against 4.58). The one more
// keeps them for what a GPU worker's step does at once with one ps, a pull's 2 stripes beside a
// push, as before the rule.
// PSCLUSTER_SEAL_HELP_ALWAYS=1: helpers for every call, for A/B.
std::atomic<int> g_calls{0};

class CallUnderWay {
 public:
  CallUnderWay() { g_calls.fetch_add(1, std::memory_order_relaxed); }
  ~CallUnderWay() { g_calls.fetch_sub(1, std::memory_order_relaxed); }
  CallUnderWay(const CallUnderWay&) = delete;
  CallUnderWay& operator=(const CallUnderWay&) = delete;

  // Whether a pool of `helpers` threads may help this call now.
  static bool MayHelp(int helpers) {
    static const bool always = [] {
      const char* env = std::getenv("PSCLUSTER_SEAL_HELP_ALWAYS");
      return env != nullptr && std::strcmp(env, "1") == 0;
    }();
    return always || g_calls.load(std::memory_order_relaxed) <= helpers + 1;
  }
};

// The chunks of one call, sealed or opened by whoever claims each first: a pool thread the
// call handed it to, or the calling thread when it needs the chunk next (to send it) or has
// nothing else left to do. A pool thread that starts late finds its chunk claimed and leaves;
// one that claimed a chunk finishes it before the call returns (Finish). Shared with the
// pool's closures, which may run after the call has returned: they touch `work` (the call's
// function) only for a chunk they claimed.
class Crew {
 public:
  // `split`: where this crew counts its chunks in g_split (0: sealed, 2: opened).
  Crew(int n, const std::function<bool(int)>* work, int split)
      : n_(n),
        split_(split),
        work_(work),
        claimed_(new std::atomic<bool>[n]()),
        done_(new std::atomic<bool>[n]()) {}

  // Hands chunk i to a pool thread.
  static void Offer(const std::shared_ptr<Crew>& crew, ThreadPool* pool, int i) {
    pool->Schedule([crew, i] { crew->Run(i, /*by_pool=*/true); });
  }
  // Has `helpers` pool threads do the chunks nobody has claimed, in order (one wake-up each
  // for every chunk of a call whose chunks are all there from the start).
  static void Enlist(const std::shared_ptr<Crew>& crew, ThreadPool* pool, int helpers) {
    for (int h = 0; h < helpers; ++h) {
      pool->Schedule([crew] {
        for (int i = crew->next_.fetch_add(1); i < crew->n_; i = crew->next_.fetch_add(1)) {
          crew->Run(i, /*by_pool=*/true);
        }
      });
    }
  }
  bool done(int i) const { return done_[i].load(std::memory_order_acquire); }
  // Does chunk i on this thread unless someone claimed it, then waits until it is done,
  // doing chunks of [i + 1, end) nobody has claimed meanwhile.
  void RunAndWait(int i, int end) {
    Run(i);
    while (!done_[i].load(std::memory_order_acquire)) {
      if (!RunAny(i + 1, end)) std::this_thread::yield();
    }
  }
  // Does the first chunk of [begin, end) nobody has claimed; false when there is none.
  bool RunAny(int begin, int end) {
    for (int i = begin; i < end; ++i) {
      if (!claimed_[i].load(std::memory_order_relaxed) && Run(i)) return true;
    }
    return false;
  }
  // Claims every chunk not claimed yet without doing it, and waits for those under way.
  void Finish(int n) {
    for (int i = 0; i < n; ++i) {
      if (!claimed_[i].exchange(true)) done_[i].store(true, std::memory_order_release);
      while (!done_[i].load(std::memory_order_acquire)) std::this_thread::yield();
    }
    g_split[split_].fetch_add(by_caller_, std::memory_order_relaxed);
    g_split[split_ + 1].fetch_add(by_pool_.load(std::memory_order_relaxed),
                                  std::memory_order_relaxed);
  }
  bool failed() const { return failed_.load(); }

 private:
  // Does chunk i unless someone claimed it; whether this call did it.
  bool Run(int i, bool by_pool = false) {
    if (claimed_[i].exchange(true)) return false;
    if (!(*work_)(i)) failed_.store(true);
    if (by_pool) {
      by_pool_.fetch_add(1, std::memory_order_relaxed);  // seen by Finish after done_[i]
    } else {
      ++by_caller_;
    }
    done_[i].store(true, std::memory_order_release);
    return true;
  }

  const int n_;
  const int split_;
  const std::function<bool(int)>* const work_;
  std::atomic<int> next_{0};  // Enlist's helpers' next chunk
  std::unique_ptr<std::atomic<bool>[]> claimed_;
  std::unique_ptr<std::atomic<bool>[]> done_;
  std::atomic<bool> failed_{false};
  int64_t by_caller_ = 0;  // the calling thread's chunks (only it runs them)
  std::atomic<int64_t> by_pool_{0};
};

// The chunks of a write: small buffers (a frame's header and meta) gathered into one, a large
// buffer cut into chunks of its own.
void CutIntoChunks(const struct iovec* iov, int count, std::vector<Piece>& pieces,
                   std::vector<Chunk>& chunks) {
  const auto open_chunk = [&] {
    chunks.emplace_back();
    chunks.back().first_piece = static_cast<int>(pieces.size());
  };
  const size_t max_chunk = SealedChannel::WriteChunkBytes();
  const size_t own_chunk = std::min(kOwnChunkBytes, max_chunk);
  for (int i = 0; i < count; ++i) {
    const char* data = static_cast<const char*>(iov[i].iov_base);
    size_t size = iov[i].iov_len;
    if (size == 0) continue;
    if (size >= own_chunk || chunks.empty() || chunks.back().size + size > max_chunk ||
        chunks.back().size >= own_chunk) {
      open_chunk();
    }
    while (size > 0) {
      Chunk& c = chunks.back();
      const size_t take = std::min(size, max_chunk - c.size);
      pieces.push_back({data, take});
      ++c.num_pieces;
      c.size += static_cast<uint32_t>(take);
      data += take;
      size -= take;
      if (size > 0) open_chunk();
    }
  }
}

absl::Status Unauthentic() {
  return absl::DataLossError(
      "a data-plane chunk did not authenticate (changed, replayed or out of order on the way); "
      "the connection is closed");
}

}  // namespace

SealedChannel::WorkSplit SealedChannel::Split() {
  WorkSplit split;
  split.sealed_by_caller = g_split[0].load(std::memory_order_relaxed);
  split.sealed_by_pool = g_split[1].load(std::memory_order_relaxed);
  split.opened_by_caller = g_split[2].load(std::memory_order_relaxed);
  split.opened_by_pool = g_split[3].load(std::memory_order_relaxed);
  return split;
}

int SealedChannel::CallsUnderWay() { return g_calls.load(std::memory_order_relaxed); }

size_t SealedChannel::WriteChunkBytes() {
  // 48 KiB by default: a sealed chunk of 48 KiB fits one loopback segment (MSS 65,483); one of 128
  // KiB is two and a tail of 126 bytes that the reader must wait for before it can open the chunk.
  // On the 2-core VM that halved the sealed round trip (bench/sealed_channel_bench: 1 MiB at
  // 0.53-0.63 of plaintext with 128 KiB chunks, 1.19-1.20 with 48 KiB; bench/ps.sh's dense rows
  // 0.59-0.66 against 0.82-1.41); on the GPU machine's 16 cores the two are level within the runs'
  // spread.
  static const size_t bytes = [] {
    absl::StatusOr<size_t> parsed = ParseChunkBytes(std::getenv("PSCLUSTER_SEAL_CHUNK_BYTES"));
    if (parsed.ok()) return *parsed;
    LOG(ERROR) << parsed.status().message() << "; writing chunks of the default "
               << kDefaultChunkBytes << " bytes";
    return kDefaultChunkBytes;
  }();
  return bytes;
}

absl::StatusOr<size_t> SealedChannel::ParseChunkBytes(const char* value) {
  if (value == nullptr || *value == '\0') return kDefaultChunkBytes;
  uint64_t bytes = 0;
  if (!absl::SimpleAtoi(value, &bytes) || bytes < kMinChunkBytes ||
      bytes > static_cast<uint64_t>(kMaxChunkBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("PSCLUSTER_SEAL_CHUNK_BYTES is \"", value,
                                                   "\"; expected a byte count from ",
                                                   kMinChunkBytes, " to ", kMaxChunkBytes));
  }
  return static_cast<size_t>(bytes);
}

int SealedChannel::ParallelThreads() {
  if (const char* env = std::getenv("PSCLUSTER_SEAL_THREADS"); env != nullptr && *env != '\0') {
    int threads = 0;
    if (absl::SimpleAtoi(env, &threads) && threads >= 0 && threads <= 64) return threads;
    PS_LOG_FIRST_N(ERROR, 1) << "PSCLUSTER_SEAL_THREADS is \"" << env
                             << "\"; expected 0 to 64 helper threads; choosing by the cores";
  }
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores < 8) return 0;
  // libipsec-mb seals 4x faster than OpenSSL: two helpers keep up with the socket, and more
  // cost more in hand-offs than they seal (bench/sealed_channel_bench on 16 cores: 1 MiB
  // round trips at 0.73-0.78 of plaintext with 2, 0.56-0.75 with 4, 0.57-0.58 with none).
  if (aes_gcm::DefaultEngine() == aes_gcm::Engine::kIpsecMb) return 2;
  return std::clamp(cores / 4, 2, 8);
}

SealedChannel::SealedChannel(int fd, ssl_st* ssl, bool is_server, int epoch_chunks_log2)
    : fd_(fd), ssl_(ssl), pool_(SharedPool()), epoch_shift_(epoch_chunks_log2) {
  send_.sender = is_server ? 's' : 'c';
  receive_.sender = is_server ? 'c' : 's';
}

SealedChannel::~SealedChannel() = default;

absl::StatusOr<std::unique_ptr<SealedChannel>> SealedChannel::Create(int fd, ssl_st* ssl,
                                                                     int epoch_chunks_log2) {
  if (epoch_chunks_log2 < 0 || epoch_chunks_log2 > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("epoch_chunks_log2 is ", epoch_chunks_log2, "; expected 0 to 20"));
  }
  if (SSL_version(ssl) != TLS1_3_VERSION) {
    return absl::FailedPreconditionError("sealed data-plane chunks need a TLS 1.3 connection");
  }
  if (!aes_gcm::Available(aes_gcm::DefaultEngine())) {
    return absl::InternalError("no AES-128-GCM engine (OpenSSL has none?)");
  }
  PS_LOG_FIRST_N(INFO, 1) << "tensor data plane: sealed chunks in AES-128-GCM from "
                          << aes_gcm::EngineName(aes_gcm::DefaultEngine()) << ", "
                          << ParallelThreads() << " helper threads";
  std::unique_ptr<SealedChannel> channel(
      new SealedChannel(fd, ssl, SSL_is_server(ssl) == 1, epoch_chunks_log2));
  // The first epoch's keys now, so that a failure shows at connect.
  Key key;
  uint64_t seq;
  for (Direction* d : {&channel->send_, &channel->receive_}) {
    if (absl::Status s = channel->NextKey(d, &key, &seq); !s.ok()) return s;
    d->seq = 0;
  }
  return channel;
}

absl::Status SealedChannel::NextKey(Direction* d, Key* key, uint64_t* seq) {
  const uint64_t epoch = d->seq >> epoch_shift_;
  if (epoch != d->epoch) {
    unsigned char context[9];
    context[0] = static_cast<unsigned char>(d->sender);
    absl::big_endian::Store64(context + 1, epoch);
    unsigned char material[sizeof(Key)];
    if (SSL_export_keying_material(ssl_, material, sizeof(material), kExporterLabel,
                                   sizeof(kExporterLabel) - 1, context, sizeof(context), 1) != 1) {
      return absl::InternalError("cannot export the data plane's keys from the TLS connection");
    }
    std::memcpy(d->key.key, material, sizeof(d->key.key));
    std::memcpy(d->key.iv, material + sizeof(d->key.key), sizeof(d->key.iv));
    d->epoch = epoch;
  }
  *key = d->key;
  *seq = d->seq & ((uint64_t{1} << epoch_shift_) - 1);
  ++d->seq;
  return absl::OkStatus();
}

absl::Status SealedChannel::Write(const struct iovec* iov, int count, absl::Time deadline) {
  if (!broken_.ok()) return broken_;
  if (staged_bytes() > 0) {
    if (absl::Status s = Flush(deadline); !s.ok()) return s;
  }
  const CallUnderWay call;
  std::vector<Piece> pieces;
  std::vector<Chunk> chunks;
  CutIntoChunks(iov, count, pieces, chunks);
  // Batch by batch: the pool seals a batch's chunks while this thread sends each in order as
  // soon as it is sealed (sealing it itself when no pool thread has yet).
  for (size_t begin = 0; begin < chunks.size(); begin += kBatchChunks) {
    const int n = static_cast<int>(std::min<size_t>(kBatchChunks, chunks.size() - begin));
    size_t bytes = 0;
    for (int i = 0; i < n; ++i) bytes += kHeaderBytes + chunks[begin + i].size + kTagBytes;
    if (send_buf_.size() < bytes) send_buf_.resize(bytes);
    char* at = send_buf_.data();
    for (int i = 0; i < n; ++i) {
      Chunk& c = chunks[begin + i];
      c.sealed = at;
      at += kHeaderBytes + c.size + kTagBytes;
      if (absl::Status s = NextKey(&send_, &c.key, &c.seq); !s.ok()) return broken_ = s;
    }
    const std::function<bool(int)> seal = [&](int i) {
      return Seal(chunks[begin + i], pieces.data());
    };
    auto crew = std::make_shared<Crew>(n, &seal, 0);
    if (pool_ != nullptr && n > 1 && CallUnderWay::MayHelp(pool_->num_threads())) {
      Crew::Enlist(crew, pool_, std::min(pool_->num_threads(), n - 1));
    }
    absl::Status sent;
    for (int i = 0; i < n && sent.ok();) {
      crew->RunAndWait(i, n);
      // Chunk i and every one after it sealed by now, which lie one after the other: one send.
      int end = i + 1;
      while (end < n && crew->done(end)) ++end;
      if (crew->failed()) {
        sent = absl::InternalError("sealing a data-plane chunk failed");
        break;
      }
      const Chunk& last = chunks[begin + end - 1];
      char* const from = chunks[begin + i].sealed;
      iovec out{from,
                static_cast<size_t>(last.sealed + kHeaderBytes + last.size + kTagBytes - from)};
      // While the socket's buffer is full, this thread seals the chunks that follow.
      sent = SendAll(fd_, &out, 1, deadline, [&] { return crew->RunAny(end, n); });
      i = end;
    }
    crew->Finish(n);
    if (!sent.ok()) return broken_ = sent;
  }
  return absl::OkStatus();
}

absl::Status SealedChannel::Stage(const struct iovec* iov, int count) {
  if (!broken_.ok()) return broken_;
  const CallUnderWay call;
  std::vector<Piece> pieces;
  std::vector<Chunk> chunks;
  CutIntoChunks(iov, count, pieces, chunks);
  if (chunks.empty()) return absl::OkStatus();
  size_t bytes = 0;
  for (const Chunk& c : chunks) bytes += kHeaderBytes + c.size + kTagBytes;
  // (Grown, never shrunk: the bytes are written over, not cleared, call after call.)
  if (staged_.size() < staged_bytes_ + bytes) staged_.resize(staged_bytes_ + bytes);
  char* at = staged_.data() + staged_bytes_;
  for (Chunk& c : chunks) {
    c.sealed = at;
    at += kHeaderBytes + c.size + kTagBytes;
    if (absl::Status s = NextKey(&send_, &c.key, &c.seq); !s.ok()) return broken_ = s;
  }
  const int n = static_cast<int>(chunks.size());
  const std::function<bool(int)> seal = [&](int i) { return Seal(chunks[i], pieces.data()); };
  auto crew = std::make_shared<Crew>(n, &seal, 0);
  if (pool_ != nullptr && n > 1 && CallUnderWay::MayHelp(pool_->num_threads())) {
    Crew::Enlist(crew, pool_, std::min(pool_->num_threads(), n - 1));
  }
  // In order, as Write does (after the bytes kept before), but sending only what the socket
  // takes at once: once it is full the rest is sealed and kept. (PSCLUSTER_SEAL_STAGE_EAGER=0:
  // nothing is sent before Flush, as before 9e4935f, for A/B.)
  static const bool eager = [] {
    const char* env = std::getenv("PSCLUSTER_SEAL_STAGE_EAGER");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  bool sending = eager;
  absl::Status sent;
  for (int i = 0; i < n && sent.ok();) {
    crew->RunAndWait(i, n);
    int end = i + 1;
    while (end < n && crew->done(end)) ++end;
    if (crew->failed()) break;
    if (sending) {
      const Chunk& last = chunks[end - 1];
      const size_t ready =
          static_cast<size_t>(last.sealed + kHeaderBytes + last.size + kTagBytes - staged_.data());
      absl::StatusOr<size_t> took =
          SendWithoutWaiting(fd_, staged_.data() + staged_sent_, ready - staged_sent_);
      if (took.ok()) {
        staged_sent_ += *took;
        sending = staged_sent_ == ready;
      } else {
        sent = took.status();
      }
    }
    i = end;
  }
  crew->Finish(n);
  if (!sent.ok()) return broken_ = sent;
  if (crew->failed()) return broken_ = absl::InternalError("sealing a data-plane chunk failed");
  staged_bytes_ += bytes;
  if (staged_sent_ == staged_bytes_) staged_bytes_ = staged_sent_ = 0;
  return absl::OkStatus();
}

absl::Status SealedChannel::Flush(absl::Time deadline) {
  if (!broken_.ok()) return broken_;
  if (staged_bytes_ == staged_sent_) return absl::OkStatus();
  iovec out{staged_.data() + staged_sent_, staged_bytes_ - staged_sent_};
  absl::Status sent = SendAll(fd_, &out, 1, deadline);
  staged_bytes_ = staged_sent_ = 0;
  if (!sent.ok()) return broken_ = sent;
  return absl::OkStatus();
}

absl::Status SealedChannel::Read(char* out, int64_t n, absl::Time deadline) {
  if (!broken_.ok()) return broken_;
  if (HasBuffered()) {
    const int64_t take = std::min<int64_t>(n, buffered_.size() - buffered_pos_);
    std::memcpy(out, buffered_.data() + buffered_pos_, static_cast<size_t>(take));
    buffered_pos_ += static_cast<size_t>(take);
    out += take;
    n -= take;
  }
  // Received into receive_buf_ as the bytes arrive (as many at once as have arrived, but
  // never past this read's last chunk), each chunk handed to the pool to open as soon as it is
  // whole, straight into `out` but a last one larger than what is left, which is opened aside
  // and handed out in part. While nothing arrives, this thread opens chunks itself.
  const CallUnderWay call;
  Chunk chunks[kBatchChunks];
  size_t have = 0;  // bytes in receive_buf_: the start of the next batch's chunks
  while (n > 0) {
    // Room for this batch's chunks, made before any is handed out (they must not move).
    const size_t capacity =
        static_cast<size_t>(std::min<int64_t>(kBatchChunks, n / kMaxChunkBytes + 2) * kSealedMax);
    if (receive_buf_.size() < capacity) receive_buf_.resize(capacity);
    char* const buf = receive_buf_.data();
    const std::function<bool(int)> open = [&](int i) { return Open(chunks[i]); };
    auto crew = std::make_shared<Crew>(kBatchChunks, &open, 2);
    const bool helped = pool_ != nullptr && CallUnderWay::MayHelp(pool_->num_threads());
    int got = 0;          // whole chunks in this batch
    size_t parsed = 0;    // their bytes
    int64_t covered = 0;  // their plaintext bytes
    const auto open_received = [&] { return crew->RunAny(0, got); };
    absl::Status received;
    // (Room for one more whole chunk is left each time round.)
    while (got < kBatchChunks && covered < n && capacity - parsed >= kSealedMax) {
      const size_t pending = have - parsed;  // of the next chunk
      uint32_t size = 0;
      if (pending >= kHeaderBytes) {
        size = absl::little_endian::Load32(buf + parsed);
        if (size == 0 || size > kMaxChunkBytes) {
          received = absl::DataLossError(absl::StrCat(
              "a data-plane chunk claims ", size, " bytes; expected 1 to ", kMaxChunkBytes,
              " (not this cluster's sealed framing?); the connection is closed"));
          break;
        }
        const size_t whole = kHeaderBytes + size + kTagBytes;
        if (pending >= whole) {
          Chunk& c = chunks[got];
          c.sealed = buf + parsed;
          c.size = size;
          received = NextKey(&receive_, &c.key, &c.seq);
          if (!received.ok()) break;
          if (covered + size <= n) {
            c.plain = out + covered;
          } else {
            buffered_.resize(size);
            c.plain = buffered_.data();
          }
          parsed += whole;
          covered += size;
          ++got;
          if (helped && covered < n) Crew::Offer(crew, pool_, got - 1);
          continue;
        }
      }
      // More bytes: at least the rest of the next chunk's header or of the chunk, at most what
      // the batch has room for and what this read's chunks still hold: the rest of its bytes
      // and at least one chunk's framing (and a chunk whose header came, all of its own).
      const int64_t need = pending < kHeaderBytes
                               ? kHeaderBytes - static_cast<int64_t>(pending)
                               : kHeaderBytes + size + kTagBytes - static_cast<int64_t>(pending);
      const int64_t rest = (n - covered) + kHeaderBytes + kTagBytes - static_cast<int64_t>(pending);
      const int64_t limit = std::max(need, std::min(static_cast<int64_t>(capacity - have), rest));
      absl::StatusOr<int64_t> more =
          ReceiveAtLeast(fd_, buf + have, need, limit, deadline, open_received);
      if (!more.ok()) {
        received = more.status();
        break;
      }
      have += static_cast<size_t>(*more);
    }
    for (int i = 0; i < got && received.ok(); ++i) crew->RunAndWait(i, got);
    crew->Finish(kBatchChunks);
    if (!received.ok()) return broken_ = received;
    if (crew->failed()) {
      buffered_.clear();
      buffered_pos_ = 0;
      return broken_ = Unauthentic();
    }
    // The start of the next batch's first chunk, received with this batch's (never bytes past
    // this read's last chunk).
    have -= parsed;
    if (have > 0) {
      if (covered >= n) return broken_ = absl::InternalError("sealed read past its chunks");
      std::memmove(buf, buf + parsed, have);
    }
    if (covered > n) {
      // The last chunk went aside: its first bytes finish this read.
      const size_t head = buffered_.size() - static_cast<size_t>(covered - n);
      std::memcpy(out + (n - static_cast<int64_t>(head)), buffered_.data(), head);
      buffered_pos_ = head;
      n = 0;
    } else {
      out += covered;
      n -= covered;
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster
