#include "ps_server/tensor_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log_once.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "glog/logging.h"
#include "security/authz.h"

namespace pscluster {
namespace {

// Responses up to this size are assembled and sent with one system call.
constexpr int64_t kSmallResponseBytes = 64 << 10;
// Pieces in which payloads are received and encoded.
constexpr int64_t kPieceBytes = 1 << 20;
// Pieces in which a push with backups is received (replication 2): each goes on to the backups
// as soon as it arrived (PushStreams::Piece), so the smaller they are the sooner the forward
// follows the push. PSCLUSTER_FORWARD_PIECE_BYTES (16 KiB to 1 MiB) overrides it.
constexpr int64_t kForwardPieceBytes = 256 << 10;

int64_t ForwardPieceBytes() {
  static const int64_t bytes = [] {
    const char* env = std::getenv("PSCLUSTER_FORWARD_PIECE_BYTES");
    if (env == nullptr || *env == '\0') return kForwardPieceBytes;
    int64_t b = 0;
    if (!absl::SimpleAtoi(env, &b) || b < (16 << 10) || b > kPieceBytes) {
      LOG(ERROR) << "PSCLUSTER_FORWARD_PIECE_BYTES is \"" << env
                 << "\"; expected a byte count from 16384 to " << kPieceBytes << "; using "
                 << kForwardPieceBytes;
      return kForwardPieceBytes;
    }
    return b;
  }();
  return bytes;
}

}  // namespace

// One accepted connection: reads a request, answers it, and again, until the peer closes, an
// I/O error or a request that cannot be framed ends it.
class TensorServer::Connection {
 public:
  Connection(ParameterStore* store, const TensorServerOptions& options, int fd,
             std::atomic<int64_t>* closed_idle)
      : store_(store), options_(options), socket_(fd), closed_idle_(closed_idle) {}

  void Serve() {
    ServeRequests();
    // The peer sees the end now; the descriptor is closed when the server reaps the thread.
    socket_.Shutdown();
    done_.store(true);
  }

  void Shutdown() { socket_.Shutdown(); }
  bool done() const { return done_.load(); }
  // When it began waiting for its next request (Unix nanoseconds), or 0 in a request.
  int64_t idle_since() const { return idle_since_.load(); }

 private:
  // The handshake (with TLS), then requests until the peer closes, an I/O error, an idle or
  // request timeout, or a request that cannot be framed.
  void ServeRequests() {
    if (options_.tls != nullptr && !Authenticate()) return;
    while (true) {
      // Between requests: idle_timeout at most (Shutdown() wakes it sooner).
      idle_since_.store(absl::ToUnixNanos(absl::Now()));
      absl::Status waited = socket_.AwaitReadable(options_.idle_timeout);
      idle_since_.store(0);
      if (!waited.ok()) {
        if (waited.code() == absl::StatusCode::kDeadlineExceeded) closed_idle_->fetch_add(1);
        break;
      }
      // A request begun: its header, as every other part, within io_timeout.
      char raw[kFrameHeaderBytes];
      absl::Status s = socket_.ReadExact(raw, kFrameHeaderBytes, options_.io_timeout);
      if (!s.ok()) break;
      absl::StatusOr<FrameHeader> header = DecodeFrameHeader(raw);
      if (!header.ok()) {
        Fatal(FrameHeader(), header.status());
        break;
      }
      if (!Handle(*header)) break;
    }
  }

  // The TLS handshake, and who the peer is; false (logged) when it fails.
  bool Authenticate() {
    absl::StatusOr<SslPtr> ssl = options_.tls->Handshake(socket_.fd(), "", options_.io_timeout);
    absl::StatusOr<PeerIdentity> peer =
        ssl.ok() ? PeerIdentityOf(ssl->get(), options_.cluster) : ssl.status();
    if (!peer.ok()) {
      LOG_EVERY_N(WARNING, 20) << "tensor data plane: refused a connection: " << peer.status();
      return false;
    }
    // Sealed chunks (common/sealed_channel.h) unless kernel TLS was asked for: then TLS
    // records, which the kernel encrypts where it can.
    const bool sealed = !options_.kernel_tls_wanted;
    if (options_.kernel_tls_wanted && KernelTlsSend(ssl->get())) {
      PS_LOG_FIRST_N(INFO, 1) << "tensor data plane: kernel TLS (kTLS) encrypts this ps's sends";
    } else if (options_.kernel_tls_wanted) {
      PS_LOG_FIRST_N(WARNING, 1) << "tensor data plane: kernel TLS was asked for but is not "
                                    "available (kernel or OpenSSL): OpenSSL encrypts TLS records";
    }
    absl::Status admitted = options_.tls->Admit(ssl->get(), sealed, options_.io_timeout);
    if (admitted.ok()) admitted = socket_.AttachTls(ssl->release(), sealed);
    if (!admitted.ok()) {
      LOG_EVERY_N(WARNING, 20) << "tensor data plane: lost a connection at admission: " << admitted;
      return false;
    }
    peer_ = *peer;
    return true;
  }

  // Whether this task may serve pulls and pushes now (BackupStores::CheckLease).
  absl::Status Lease() const {
    return options_.backups == nullptr ? absl::OkStatus() : options_.backups->CheckLease();
  }
  // Whether it serves `store` (BackupStores::CheckServes: not its own once failed over).
  absl::Status Serves(const ParameterStore* store) const {
    return options_.backups == nullptr ? absl::OkStatus() : options_.backups->CheckServes(store);
  }

  // The store a sparse pull or push of the n keys read into keys_ goes to
  // (BackupStores::SparseStore).
  ParameterStore* SparseStore(const std::string& table, int64_t n) const {
    return options_.backups == nullptr
               ? store_
               : options_.backups->SparseStore(store_, table, keys_.data(), n);
  }
  // The store a dense pull or push of `shards` goes to (BackupStores::DenseStore).
  ParameterStore* DenseStore(const google::protobuf::RepeatedPtrField<v1::ShardRef>& shards) const {
    return options_.backups == nullptr ? store_ : options_.backups->DenseStore(store_, shards);
  }

  // With TLS: OK when the peer may make this call (acting for worker `worker`, for a push), as
  // over gRPC. Without: OK.
  absl::Status Allowed(const char* method, const int32_t* worker = nullptr) const {
    if (!peer_.has_value()) return absl::OkStatus();
    if (worker == nullptr) return Authorize(*peer_, method);
    const v1::TaskId task = WorkerTask(*worker);
    return Authorize(*peer_, method, &task);
  }
  // The same, for a call made for `task`.
  absl::Status AllowedFor(const char* method, const v1::TaskId& task) const {
    if (!peer_.has_value()) return absl::OkStatus();
    return Authorize(*peer_, method, &task);
  }

  // Serves one request; false when the connection must close.
  bool Handle(const FrameHeader& request) {
    if (request.meta_bytes > options_.max_meta_bytes) {
      return Fatal(request, absl::InvalidArgumentError(absl::StrCat(
                                "a ", WireOpName(request.op), " request with ", request.meta_bytes,
                                " bytes of meta; at most ", options_.max_meta_bytes)));
    }
    meta_.resize(request.meta_bytes);
    if (!socket_.ReadExact(meta_.data(), request.meta_bytes, options_.io_timeout).ok()) {
      return false;
    }
    switch (static_cast<WireOp>(request.op)) {
      case WireOp::kPullDense:
        return PullDense(request);
      case WireOp::kPushDense:
        return PushDense(request);
      case WireOp::kPullSparse:
        return PullSparse(request);
      case WireOp::kPushSparse:
        return PushSparse(request);
      case WireOp::kReplicate:
        return Replicate(request);
      case WireOp::kReplicateStream:
        return ReplicateStream(request);
      case WireOp::kReplicateCommit:
        return Fatal(request, absl::InvalidArgumentError(
                                  "a ReplicateCommit without the ReplicateStream it commits"));
      case WireOp::kReplicateSparse:
        return ReplicateSparse(request);
    }
    return Refuse(request, request.payload_bytes,
                  absl::UnimplementedError(absl::StrCat(
                      "unknown tensor wire op ", request.op,
                      " (this ps serves PullDense 1, PushDense 2, PullSparse 3, PushSparse 4, "
                      "Replicate 5, ReplicateStream 6 with its ReplicateCommit 7, "
                      "ReplicateSparse 8)")));
  }

  bool PullDense(const FrameHeader& request) {
    v1::PullDenseRequest req;
    if (!req.ParseFromString(meta_)) {
      return Refuse(request, request.payload_bytes, BadMeta("PullDenseRequest"));
    }
    if (absl::Status s = Allowed("ParameterServer.PullDense"); !s.ok()) {
      return Refuse(request, request.payload_bytes, s);
    }
    if (request.payload_bytes != 0) {
      return Refuse(request, request.payload_bytes,
                    absl::InvalidArgumentError("a PullDense request carries no payload"));
    }
    if (absl::Status s = Lease(); !s.ok()) return Refuse(request, request.payload_bytes, s);
    ParameterStore* store = DenseStore(req.shards());
    if (absl::Status s = Serves(store); !s.ok()) return Refuse(request, request.payload_bytes, s);
    const v1::DataType wire = WireOrFloat(req.wire_dtype());
    Sink sink(this, request, wire);
    absl::Status s = store->PullDense(req, &sink);
    if (sink.streaming()) {
      // A broken stream cannot be answered.
      return s.ok() && sink.io().ok() && socket_.Flush(options_.io_timeout).ok();
    }
    if (!s.ok()) return Respond(request, s, "", nullptr, 0);
    return Respond(request, absl::OkStatus(), "", small_.data(),
                   static_cast<int64_t>(small_.size()));
  }

  bool PushDense(const FrameHeader& request) {
    v1::PushDenseHeader header;
    if (!header.ParseFromString(meta_)) {
      return Refuse(request, request.payload_bytes, BadMeta("PushDenseHeader"));
    }
    const int32_t worker = header.worker();
    if (absl::Status s = Allowed("ParameterServer.PushDense", &worker); !s.ok()) {
      return Refuse(request, request.payload_bytes, s);
    }
    if (absl::Status s = Lease(); !s.ok()) return Refuse(request, request.payload_bytes, s);
    ParameterStore* store = DenseStore(header.shards());
    if (absl::Status s = Serves(store); !s.ok()) return Refuse(request, request.payload_bytes, s);
    if (absl::Status s = store->StartPushDense(header, &push_); !s.ok()) {
      return Refuse(request, request.payload_bytes, s);
    }
    // Replicated shards: their backups get the gradients as they arrive here.
    std::unique_ptr<PushStreams> streams = store->OpenForwardStreams(push_);
    uint64_t left = request.payload_bytes;
    absl::Status bad;
    if (!ReadPushPayload(request, &left, &bad, streams.get())) return false;
    if (!bad.ok()) return Refuse(request, left, bad);
    v1::PushDenseResponse resp;
    absl::Status s = store->FinishPushDense(&push_, &resp, streams.get());
    return Respond(request, s, s.ok() ? resp.SerializeAsString() : "", nullptr, 0);
  }

  // A forward sent while the primary receives the push (ReplicateStream): its gradients, then
  // the frame that commits it (ReplicateCommit, with the versions), answered as Replicate. Any
  // refusal closes the connection: the primary, which waits for the commit's answer, sees it
  // fail and forwards after its apply instead.
  bool ReplicateStream(const FrameHeader& request) {
    v1::ReplicateHeader header;
    absl::StatusOr<ParameterStore*> store = ForwardTarget(request, &header);
    if (!store.ok()) return Fatal(request, store.status());
    if (absl::Status s = (*store)->StartPushDense(header.push(), &push_, /*forwarded=*/true);
        !s.ok()) {
      return Fatal(request, s);
    }
    uint64_t left = request.payload_bytes;
    absl::Status bad;
    if (!ReadPushPayload(request, &left, &bad)) return false;
    if (!bad.ok()) return Fatal(request, bad);
    char raw[kFrameHeaderBytes];
    if (!socket_.ReadExact(raw, kFrameHeaderBytes, options_.io_timeout).ok()) return false;
    absl::StatusOr<FrameHeader> commit = DecodeFrameHeader(raw);
    if (!commit.ok() || commit->op != static_cast<uint16_t>(WireOp::kReplicateCommit) ||
        commit->payload_bytes != 0 || commit->meta_bytes > options_.max_meta_bytes) {
      return Fatal(
          commit.ok() ? *commit : request,
          absl::InvalidArgumentError("a ReplicateStream must be followed by its ReplicateCommit"));
    }
    meta_.resize(commit->meta_bytes);
    if (!socket_.ReadExact(meta_.data(), commit->meta_bytes, options_.io_timeout).ok()) {
      return false;
    }
    v1::ReplicateHeader versions;
    if (!versions.ParseFromString(meta_)) return Fatal(*commit, BadMeta("ReplicateHeader"));
    *header.mutable_versions() = versions.versions();
    header.set_accepted(versions.accepted());
    header.set_dropped_stale(versions.dropped_stale());
    v1::ReplicateResponse resp;
    absl::Status s = (*store)->ApplyReplicatedDense(header, &push_, &resp);
    return Respond(*commit, s, s.ok() ? resp.SerializeAsString() : "", nullptr, 0);
  }

  // A forward's header (meta_) checked: the caller is the primary it names (with TLS), this
  // task backs it up, float32 gradients. The store of that primary's backups.
  absl::StatusOr<ParameterStore*> ForwardTarget(const FrameHeader& request,
                                                v1::ReplicateHeader* header) {
    if (!header->ParseFromString(meta_)) return BadMeta("ReplicateHeader");
    v1::TaskId primary;
    primary.set_job("ps");
    primary.set_index(header->primary_ps_task());
    PS_RETURN_IF_ERROR(AllowedFor("ParameterServer.Replicate", primary));
    if (options_.backups == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this ps task holds no backup of ps:", header->primary_ps_task(), "'s shards"));
    }
    PS_ASSIGN_OR_RETURN(ParameterStore * store,
                        options_.backups->ForForward(header->primary_ps_task()));
    if (header->push().wire_dtype() != v1::DT_FLOAT32 &&
        header->push().wire_dtype() != v1::DT_INVALID) {
      return absl::InvalidArgumentError("a Replicate request carries float32 gradients");
    }
    return store;
  }

  // A primary ps task's forward of a table push it applied, to the backups this task holds of
  // its virtual shards (as ParameterServer.ReplicateSparse): the keys and gradients read into
  // the request, applied by the backup store of primary_ps_task.
  bool ReplicateSparse(const FrameHeader& request) {
    v1::ReplicateSparseRequest req;
    if (!req.ParseFromString(meta_)) {
      return Refuse(request, request.payload_bytes, BadMeta("ReplicateSparseRequest"));
    }
    v1::TaskId primary;
    primary.set_job("ps");
    primary.set_index(req.primary_ps_task());
    absl::Status s = AllowedFor("ParameterServer.ReplicateSparse", primary);
    absl::StatusOr<ParameterStore*> store = absl::FailedPreconditionError(
        absl::StrCat("this ps task holds no backup of ps:", req.primary_ps_task(), "'s shards"));
    if (s.ok() && options_.backups != nullptr) {
      store = options_.backups->ForForward(req.primary_ps_task());
    }
    if (s.ok()) s = store.status();
    // Float32 gradients of (a part of) a push the primary took, perhaps in 16-bit floats.
    const uint64_t most = 2 * static_cast<uint64_t>(options_.max_sparse_payload_bytes);
    if (s.ok() && request.payload_bytes > most) {
      s = absl::InvalidArgumentError(absl::StrCat("a ReplicateSparse request of ",
                                                  request.payload_bytes, " payload bytes; at most ",
                                                  most, " (twice a push's)"));
    }
    if (s.ok() && (!req.keys().empty() || !req.gradients().empty())) {
      s = absl::InvalidArgumentError(
          "a ReplicateSparse frame carries its keys and gradients as the payload, not in its meta");
    }
    int64_t n = 0;
    for (const v1::SparseStripeGroup& g : req.groups()) n += std::max<int64_t>(g.count(), 0);
    if (s.ok() && static_cast<uint64_t>(n) * sizeof(int64_t) > request.payload_bytes) {
      s = absl::InvalidArgumentError(absl::StrCat("a ReplicateSparse of ", n, " keys carries only ",
                                                  request.payload_bytes, " payload bytes"));
    }
    if (!s.ok()) return Refuse(request, request.payload_bytes, s);
    std::string* keys = req.mutable_keys();
    std::string* grads = req.mutable_gradients();
    keys->resize(n * sizeof(int64_t));
    grads->resize(request.payload_bytes - keys->size());
    if (!socket_.ReadExact(keys->data(), keys->size(), options_.io_timeout).ok() ||
        !socket_.ReadExact(grads->data(), grads->size(), options_.io_timeout).ok()) {
      return false;
    }
    v1::ReplicateSparseResponse resp;
    s = (*store)->ApplyReplicatedSparse(req, &resp);
    return Respond(request, s, s.ok() ? resp.SerializeAsString() : "", nullptr, 0);
  }

  // A primary ps task's forward of the dense updates it applied, to the backups this task
  // holds of its shards (issue 37): as a push, into the backup store of primary_ps_task.
  bool Replicate(const FrameHeader& request) {
    v1::ReplicateHeader header;
    absl::StatusOr<ParameterStore*> found = ForwardTarget(request, &header);
    if (!found.ok()) return Refuse(request, request.payload_bytes, found.status());
    ParameterStore* store = *found;
    if (absl::Status s = store->StartPushDense(header.push(), &push_, /*forwarded=*/true);
        !s.ok()) {
      return Refuse(request, request.payload_bytes, s);
    }
    uint64_t left = request.payload_bytes;
    absl::Status bad;
    if (!ReadPushPayload(request, &left, &bad)) return false;
    if (!bad.ok()) return Refuse(request, left, bad);
    v1::ReplicateResponse resp;
    absl::Status s = store->ApplyReplicatedDense(header, &push_, &resp);
    return Respond(request, s, s.ok() ? resp.SerializeAsString() : "", nullptr, 0);
  }

  // Reads a started push's payload (push_) from the socket into its gradient buffers. False
  // when the connection broke; otherwise *bad is what the push refused (the payload not
  // matching its shards, a chunk out of place), with *left the bytes still to drain.
  bool ReadPushPayload(const FrameHeader& request, uint64_t* left, absl::Status* bad,
                       PushStreams* streams = nullptr) {
    if (request.payload_bytes != static_cast<uint64_t>(push_.payload_bytes())) {
      *bad = absl::InvalidArgumentError(
          absl::StrCat("the push carries ", request.payload_bytes,
                       " payload bytes; the shards of its header need ", push_.payload_bytes()));
      return true;
    }
    const int elem = push_.wire_bytes_per_element();
    const int64_t piece = (streams != nullptr ? ForwardPieceBytes() : kPieceBytes) / elem;
    for (int i = 0; i < push_.num_shards() && bad->ok(); ++i) {
      for (int64_t offset = 0; offset < push_.num_elements(i) && bad->ok(); offset += piece) {
        const int64_t count = std::min(piece, push_.num_elements(i) - offset);
        if (push_.wire_dtype() == v1::DT_FLOAT32) {
          // Straight into the gradient buffer.
          absl::StatusOr<float*> dst = push_.Destination(i, offset, count);
          if (!dst.ok()) {
            *bad = dst.status();
            break;
          }
          if (!socket_.ReadExact(*dst, count * elem, options_.io_timeout).ok()) return false;
          *left -= count * elem;
          *bad = push_.Received(i, offset, count);
        } else {
          scratch_.resize(count * elem);
          if (!socket_.ReadExact(scratch_.data(), count * elem, options_.io_timeout).ok()) {
            return false;
          }
          *left -= count * elem;
          *bad = push_.AddChunk(i, offset, scratch_);
        }
        if (streams != nullptr && bad->ok()) streams->Piece(i, push_.values(i) + offset, count);
      }
    }
    return true;
  }

  bool PullSparse(const FrameHeader& request) {
    v1::PullSparseRequest req;
    if (!req.ParseFromString(meta_)) {
      return Refuse(request, request.payload_bytes, BadMeta("PullSparseRequest"));
    }
    if (absl::Status s = Allowed("ParameterServer.PullSparse"); !s.ok()) {
      return Refuse(request, request.payload_bytes, s);
    }
    if (absl::Status s = Lease(); !s.ok()) return Refuse(request, request.payload_bytes, s);
    if (absl::Status s = CheckSparsePayload(request, request.payload_bytes); !s.ok()) {
      return Refuse(request, request.payload_bytes, s);
    }
    const int64_t n = static_cast<int64_t>(request.payload_bytes / sizeof(int64_t));
    keys_.resize(n);
    if (!socket_.ReadExact(keys_.data(), n * sizeof(int64_t), options_.io_timeout).ok()) {
      return false;
    }
    ParameterStore* store = SparseStore(req.table(), n);
    absl::Status s = Serves(store);
    if (s.ok()) s = store->PullSparse(req, keys_.data(), n, &rows_);
    if (!s.ok()) return Respond(request, s, "", nullptr, 0);
    const v1::DataType wire = WireOrFloat(req.wire_dtype());
    const int64_t count = static_cast<int64_t>(rows_.size());
    if (wire == v1::DT_FLOAT32) {
      return Respond(request, s, "", reinterpret_cast<const char*>(rows_.data()),
                     count * static_cast<int64_t>(sizeof(float)));
    }
    const int elem = WireBytesPerElement(wire).value_or(4);  // checked by the store
    scratch_.resize(count * elem);
    EncodeFloatsTo(rows_.data(), count, wire, scratch_.data());
    return Respond(request, s, "", scratch_.data(), static_cast<int64_t>(scratch_.size()));
  }

  bool PushSparse(const FrameHeader& request) {
    v1::PushSparseRequest req;
    if (!req.ParseFromString(meta_)) {
      return Refuse(request, request.payload_bytes, BadMeta("PushSparseRequest"));
    }
    const int32_t worker = req.worker();
    if (absl::Status s = Allowed("ParameterServer.PushSparse", &worker); !s.ok()) {
      return Refuse(request, request.payload_bytes, s);
    }
    if (absl::Status s = Lease(); !s.ok()) return Refuse(request, request.payload_bytes, s);
    const int64_t n = req.num_keys();
    absl::Status s = CheckSparsePayload(request, 0);
    if (s.ok() && (n < 0 || static_cast<uint64_t>(n) > request.payload_bytes / sizeof(int64_t))) {
      s = absl::InvalidArgumentError(absl::StrCat("a PushSparse of ", n, " keys carries only ",
                                                  request.payload_bytes, " payload bytes"));
    }
    if (!s.ok()) return Refuse(request, request.payload_bytes, s);
    keys_.resize(n);
    if (!socket_.ReadExact(keys_.data(), n * sizeof(int64_t), options_.io_timeout).ok()) {
      return false;
    }
    const int64_t grad_bytes = static_cast<int64_t>(request.payload_bytes) - n * 8;
    // Floats, so the gradient bytes are aligned for use in place.
    grads_.resize((grad_bytes + sizeof(float) - 1) / sizeof(float));
    if (!socket_.ReadExact(grads_.data(), grad_bytes, options_.io_timeout).ok()) return false;
    v1::PushSparseResponse resp;
    ParameterStore* store = SparseStore(req.table(), n);
    s = Serves(store);
    if (s.ok()) {
      s = store->PushSparse(
          req, keys_.data(), n,
          absl::string_view(reinterpret_cast<const char*>(grads_.data()), grad_bytes), &resp);
    }
    return Respond(request, s, s.ok() ? resp.SerializeAsString() : "", nullptr, 0);
  }

  absl::Status CheckSparsePayload(const FrameHeader& request, uint64_t keys_bytes) const {
    if (request.payload_bytes > static_cast<uint64_t>(options_.max_sparse_payload_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a ", WireOpName(request.op), " request of ", request.payload_bytes,
                       " payload bytes; this ps takes at most ", options_.max_sparse_payload_bytes,
                       " per request (split it)"));
    }
    if (keys_bytes % sizeof(int64_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a PullSparse payload of ", keys_bytes, " bytes is not a whole number of 8-byte keys"));
    }
    return absl::OkStatus();
  }

  static absl::Status BadMeta(const char* message) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request's meta is not a valid ", message, " message"));
  }

  // Drops the rest of a refused request's payload and answers with the error; a payload too
  // large to drain closes the connection instead.
  bool Refuse(const FrameHeader& request, uint64_t payload_left, const absl::Status& error) {
    const uint64_t limit =
        std::max<uint64_t>(static_cast<uint64_t>(options_.max_sparse_payload_bytes), 1ull << 32);
    if (payload_left > limit) return Fatal(request, error);
    if (!socket_.Discard(static_cast<int64_t>(payload_left), options_.io_timeout).ok()) {
      return false;
    }
    return Respond(request, error, "", nullptr, 0);
  }

  // Answers with the error and ends the connection.
  bool Fatal(const FrameHeader& request, const absl::Status& error) {
    Respond(request, error, "", nullptr, 0);
    return false;
  }

  // Sends a whole response: the header, the meta (the error message when !status.ok()) and
  // the payload, with one system call.
  bool Respond(const FrameHeader& request, const absl::Status& status, const std::string& meta,
               const char* payload, int64_t payload_bytes) {
    FrameHeader h;
    h.op = request.op | kResponseBit;
    h.tag = request.tag;
    h.status = static_cast<uint32_t>(status.code());
    const std::string error = status.ok() ? "" : std::string(status.message());
    const std::string& m = status.ok() ? meta : error;
    h.meta_bytes = static_cast<uint32_t>(m.size());
    h.payload_bytes = status.ok() ? static_cast<uint64_t>(payload_bytes) : 0;
    char raw[kFrameHeaderBytes];
    EncodeFrameHeader(h, raw);
    iovec iov[3] = {{raw, sizeof(raw)},
                    {const_cast<char*>(m.data()), m.size()},
                    {const_cast<char*>(payload), static_cast<size_t>(h.payload_bytes)}};
    return socket_.WriteAll(iov, 3, options_.io_timeout).ok();
  }

  // A pull's response: small ones are gathered and sent at once (Respond), large ones stream
  // straight from shard memory. With sealed chunks (TLS) each shard is sealed under its lock
  // (the one copy the cipher makes anyway), its chunks going out as they are sealed while the
  // socket takes them at once; the rest is sent once every lock is let go (Flush), so the apply
  // of the next push never waits for a slow reader.
  class Sink : public DensePullSink {
   public:
    Sink(Connection* c, const FrameHeader& request, v1::DataType wire)
        : c_(c), request_(request), wire_(wire) {}

    absl::Status Begin(const std::vector<int64_t>& num_elements) override {
      PS_ASSIGN_OR_RETURN(elem_, WireBytesPerElement(wire_));
      int64_t total = 0;
      for (int64_t n : num_elements) total += n * elem_;
      c_->small_.clear();
      if (total <= kSmallResponseBytes) return absl::OkStatus();
      streaming_ = true;
      FrameHeader h;
      h.op = request_.op | kResponseBit;
      h.tag = request_.tag;
      h.payload_bytes = static_cast<uint64_t>(total);
      char raw[kFrameHeaderBytes];
      EncodeFrameHeader(h, raw);
      iovec iov{raw, sizeof(raw)};
      io_ = c_->socket_.Stage(&iov, 1, c_->options_.io_timeout);
      return io_;
    }

    absl::Status Values(int, const float* values, int64_t n) override {
      if (!streaming_) {
        const size_t at = c_->small_.size();
        c_->small_.resize(at + n * elem_);
        EncodeFloatsTo(values, n, wire_, c_->small_.data() + at);
        return absl::OkStatus();
      }
      if (wire_ == v1::DT_FLOAT32) {
        iovec iov{const_cast<float*>(values), static_cast<size_t>(n) * sizeof(float)};
        io_ = c_->socket_.Stage(&iov, 1, c_->options_.io_timeout);
        return io_;
      }
      const int64_t piece = kPieceBytes / elem_;
      for (int64_t offset = 0; offset < n && io_.ok(); offset += piece) {
        const int64_t count = std::min(piece, n - offset);
        c_->scratch_.resize(count * elem_);
        EncodeFloatsTo(values + offset, count, wire_, c_->scratch_.data());
        iovec iov{c_->scratch_.data(), c_->scratch_.size()};
        io_ = c_->socket_.Stage(&iov, 1, c_->options_.io_timeout);
      }
      return io_;
    }

    bool streaming() const { return streaming_; }
    const absl::Status& io() const { return io_; }

   private:
    Connection* const c_;
    const FrameHeader request_;
    const v1::DataType wire_;
    int elem_ = 4;
    bool streaming_ = false;
    absl::Status io_;
  };

  ParameterStore* const store_;  // Not owned.
  const TensorServerOptions& options_;
  WireSocket socket_;
  std::atomic<int64_t>* const closed_idle_;  // Not owned: the server's count.
  std::atomic<bool> done_{false};
  std::atomic<int64_t> idle_since_{0};
  // With TLS, who the peer's certificate says it is.
  std::optional<PeerIdentity> peer_;
  // Kept from request to request.
  std::string meta_;
  std::string small_;
  std::string scratch_;
  DensePush push_;
  std::vector<int64_t> keys_;
  std::vector<float> rows_;
  std::vector<float> grads_;
};

absl::StatusOr<std::unique_ptr<TensorServer>> TensorServer::Start(
    ParameterStore* store, const TensorServerOptions& options) {
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  int family = AF_INET;
  std::string host = options.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
      inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<uint16_t>(options.port));
    addr_len = sizeof(sockaddr_in);
  } else if (auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
             inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) == 1) {
    family = AF_INET6;
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(options.port));
    addr_len = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("the tensor data plane binds a numeric address, not \"", options.host, "\""));
  }
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 || listen(fd, 128) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot serve the tensor data plane on ",
                                               options.host, ":", options.port, ": ",
                                               std::strerror(err)));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const int port = family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                                     : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  auto server = std::unique_ptr<TensorServer>(new TensorServer(store, options, fd, port));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TensorServer::TensorServer(ParameterStore* store, const TensorServerOptions& options, int listen_fd,
                           int port)
    : store_(store), options_(options), listen_fd_(listen_fd), port_(port) {}

TensorServer::~TensorServer() {
  Shutdown();
  close(listen_fd_);
}

int64_t TensorServer::connections_accepted() const {
  absl::MutexLock lock(&mu_);
  return accepted_;
}

int64_t TensorServer::connections_closed_idle() const { return closed_idle_.load(); }

void TensorServer::AcceptLoop() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      absl::MutexLock lock(&mu_);
      if (shut_down_) return;
      LOG(WARNING) << "tensor data plane: accept failed: " << std::strerror(errno);
      continue;
    }
    ConfigureWireSocket(fd, options_.socket_buffer_bytes);
    absl::MutexLock lock(&mu_);
    ReapLocked();
    if (shut_down_) {
      close(fd);
      return;
    }
    // Full: an idle connection makes room (its client reconnects when it needs one); idle
    // ones cannot hold the port, and a request under way ends within io_timeout.
    if (static_cast<int>(connections_.size()) >= options_.max_connections && !EvictIdlestLocked()) {
      LOG_EVERY_N(WARNING, 100) << "tensor data plane: " << connections_.size()
                                << " connections open, the most allowed, each in a request; "
                                   "closing a new one";
      close(fd);
      continue;
    }
    ++accepted_;
    auto connection = std::make_shared<Connection>(store_, options_, fd, &closed_idle_);
    connections_.push_back(Served{connection, std::thread([connection] { connection->Serve(); })});
  }
}

bool TensorServer::EvictIdlestLocked() {
  size_t idlest = connections_.size();
  int64_t oldest = 0;
  for (size_t i = 0; i < connections_.size(); ++i) {
    const int64_t since = connections_[i].connection->idle_since();
    if (since != 0 && (idlest == connections_.size() || since < oldest)) {
      idlest = i;
      oldest = since;
    }
  }
  if (idlest == connections_.size()) return false;
  // Its thread waits for a request: shut down, it ends at once.
  connections_[idlest].connection->Shutdown();
  connections_[idlest].thread.join();
  connections_[idlest] = std::move(connections_.back());
  connections_.pop_back();
  closed_idle_.fetch_add(1);
  return true;
}

void TensorServer::ReapLocked() {
  for (size_t i = 0; i < connections_.size();) {
    if (connections_[i].connection->done()) {
      connections_[i].thread.join();
      connections_[i] = std::move(connections_.back());
      connections_.pop_back();
    } else {
      ++i;
    }
  }
}

void TensorServer::Shutdown() {
  std::vector<Served> served;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    served = std::move(connections_);
    connections_.clear();
  }
  // Wakes accept() (it then fails and sees shut_down_) and every blocked connection.
  shutdown(listen_fd_, SHUT_RDWR);
  for (Served& s : served) s.connection->Shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  for (Served& s : served) s.thread.join();
}

}  // namespace pscluster
