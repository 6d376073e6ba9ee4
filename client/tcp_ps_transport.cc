#include "client/tcp_ps_transport.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "common/row_length.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "common/wire_codec.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

// "host" of "host:port" ("[::1]" of "[::1]:5").
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

iovec Bytes(const void* p, int64_t n) {
  return iovec{const_cast<void*>(p), static_cast<size_t>(n)};
}

// The meta of a sparse push of n keys.
std::string PushSparseMeta(const std::string& table, v1::DataType wire, const PushMeta& meta,
                           int64_t n) {
  v1::PushSparseRequest req;
  req.set_table(table);
  req.set_wire_dtype(wire);
  req.set_step(meta.step);
  req.set_worker(meta.worker);
  *req.mutable_request_id() = meta.request_id;
  req.set_part(meta.part);
  req.set_num_parts(meta.num_parts);
  req.set_num_keys(n);
  return req.SerializeAsString();
}

// Reads a payload of exactly `expected` bytes into floats, decoding a 16-bit wire.
absl::Status ReadFloats(WireSocket& socket, uint64_t payload_bytes, int64_t expected_elements,
                        v1::DataType wire, float* out, std::string* scratch,
                        absl::Duration timeout) {
  const int elem = WireBytesPerElement(wire).value_or(4);
  if (payload_bytes != static_cast<uint64_t>(expected_elements * elem)) {
    return absl::DataLossError(absl::StrCat("the answer carries ", payload_bytes,
                                            " bytes, expected ", expected_elements * elem));
  }
  if (wire == v1::DT_FLOAT32) return socket.ReadExact(out, expected_elements * elem, timeout);
  scratch->resize(payload_bytes);
  PS_RETURN_IF_ERROR(
      socket.ReadExact(scratch->data(), static_cast<int64_t>(payload_bytes), timeout));
  return DecodeFloats(*scratch, wire, out, expected_elements);
}

int ResolvePullStripes(int configured) {
  if (configured >= 1) return std::min(configured, 16);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int by_cores = cores < 8 ? 1 : std::clamp(cores / 2, 2, 8);
  const char* env = std::getenv("PSCLUSTER_PULL_STRIPES");
  if (env == nullptr || *env == '\0') return by_cores;
  int stripes = 0;
  if (!absl::SimpleAtoi(env, &stripes) || stripes < 1 || stripes > 16) {
    LOG(ERROR) << "PSCLUSTER_PULL_STRIPES is \"" << env << "\"; expected 1 to 16; using "
               << by_cores << " stripes (half the cores, 2 to 8; 1 under 8 cores)";
    return by_cores;
  }
  return stripes;
}

// TcpPsTransportOptions::pull_stripe_min_bytes; where it is the default,
// PSCLUSTER_PULL_STRIPE_BYTES (16 KiB to 1 GiB) where set (as PSCLUSTER_PULL_STRIPES overrides only
// the default count).
int64_t ResolveStripeBytes(int64_t configured) {
  configured = std::max<int64_t>(1, configured);
  if (configured != TcpPsTransportOptions().pull_stripe_min_bytes) return configured;
  const char* env = std::getenv("PSCLUSTER_PULL_STRIPE_BYTES");
  if (env == nullptr || *env == '\0') return configured;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(env, &bytes) || bytes < (16 << 10) || bytes > (int64_t{1} << 30)) {
    LOG(ERROR) << "PSCLUSTER_PULL_STRIPE_BYTES is \"" << env
               << "\"; expected a byte count from 16384 to 2^30; using " << configured;
    return configured;
  }
  return bytes;
}

}  // namespace

TcpPsTransport::TcpPsTransport(std::unique_ptr<GrpcPsTransport> grpc,
                               std::vector<std::string> addresses,
                               const TcpPsTransportOptions& options)
    : grpc_(std::move(grpc)),
      options_(options),
      pull_stripes_(ResolvePullStripes(options.pull_stripes)),
      pull_stripe_bytes_(ResolveStripeBytes(options.pull_stripe_min_bytes)) {
  for (const std::string& a : addresses) {
    endpoints_.push_back(std::make_unique<Endpoint>());
    absl::MutexLock lock(&endpoints_.back()->mu);
    endpoints_.back()->host = HostOf(a);
  }
}

absl::Status TcpPsTransport::SetAddress(int ps, const std::string& address) {
  PS_RETURN_IF_ERROR(grpc_->SetAddress(ps, address));
  Endpoint& e = *endpoints_[ps];
  std::vector<std::unique_ptr<Connection>> dropped;
  absl::MutexLock lock(&e.mu);
  e.host = HostOf(address);
  e.port = 0;
  ++e.epoch;
  dropped.swap(e.idle);
  return absl::OkStatus();
}

TcpPsTransport::~TcpPsTransport() = default;

int TcpPsTransport::connections_opened(int ps) const {
  absl::MutexLock lock(&endpoints_[ps]->mu);
  return endpoints_[ps]->opened;
}

absl::Status TcpPsTransport::Annotate(int ps, const absl::Status& status) const {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("ps:", ps, " (", grpc_->address(ps),
                                                  ", data plane): ", status.message()));
}

absl::StatusOr<std::unique_ptr<TcpPsTransport::Connection>> TcpPsTransport::Acquire(
    int ps, bool* pooled, const uint64_t* aborts_seen) {
  Endpoint& e = *endpoints_[ps];
  int port = 0;
  std::string host;
  uint64_t epoch = 0;
  uint64_t aborts = 0;
  {
    absl::MutexLock lock(&e.mu);
    aborts = e.aborts.load();
    // A call AbortCalls ended before it had a connection is not given one.
    if (aborts_seen != nullptr && *aborts_seen != aborts) return Ended();
    host = e.host;
    epoch = e.epoch;
    if (!e.idle.empty()) {
      std::unique_ptr<Connection> c = std::move(e.idle.back());
      e.idle.pop_back();
      c->aborts = aborts;
      *pooled = true;
      return c;
    }
    port = e.port;
    if (port < 0 && absl::Now() - e.looked_up > absl::Seconds(10)) port = 0;
  }
  *pooled = false;
  if (port == 0) {
    PS_ASSIGN_OR_RETURN(v1::TaskStatus status, grpc_->GetStatus(ps));
    port = status.data_port() > 0 ? status.data_port() : -1;
    absl::MutexLock lock(&e.mu);
    if (e.epoch != epoch) return absl::UnavailableError("the task moved to another address");
    e.port = port;
    e.ranges = status.serves_pull_ranges();
    e.looked_up = absl::Now();
  }
  if (port < 0) return std::unique_ptr<Connection>();
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<WireSocket> socket,
      WireSocket::Connect(host, port, options_.connect_timeout, options_.socket_buffer_bytes));
  if (options_.tls != nullptr) {
    // The ps's certificate must name the host dialed, as gRPC checks it.
    absl::StatusOr<SslPtr> ssl =
        options_.tls->Handshake(socket->fd(), host, options_.connect_timeout);
    if (!ssl.ok()) {
      return absl::Status(ssl.status().code(), absl::StrCat("TLS with the data port ", host, ":",
                                                            port, ": ", ssl.status().message()));
    }
    absl::StatusOr<bool> sealed =
        options_.tls->AwaitAdmission(ssl->get(), options_.connect_timeout);
    absl::Status attached =
        sealed.ok() ? socket->AttachTls(ssl->release(), *sealed) : sealed.status();
    if (!attached.ok()) {
      return absl::Status(attached.code(), absl::StrCat("TLS with the data port ", host, ":", port,
                                                        ": ", attached.message()));
    }
  }
  auto c = std::make_unique<Connection>();
  c->socket = std::move(socket);
  c->epoch = epoch;
  c->aborts = aborts;
  absl::MutexLock lock(&e.mu);
  // (Aborted while it connected: closed here, not reached by that AbortCalls.)
  if (e.aborts.load() != aborts) return Ended();
  c->endpoint = &e;
  ++e.opened;
  e.live.insert(c->socket.get());
  return c;
}

absl::Status TcpPsTransport::Ended() {
  return absl::UnavailableError("the call was ended (the task was failed over)");
}

TcpPsTransport::Connection::~Connection() {
  if (endpoint == nullptr) return;
  absl::MutexLock lock(&endpoint->mu);
  endpoint->live.erase(socket.get());
}

void TcpPsTransport::AbortCalls(int ps) {
  Endpoint& e = *endpoints_[ps];
  grpc_->AbortCalls(ps);  // (a data-port lookup, or a call without a data plane)
  std::vector<std::unique_ptr<Connection>> dropped;  // (closed once the lock is released)
  absl::MutexLock lock(&e.mu);
  // Under the lock: Acquire and Release compare it there, so no connection escapes.
  e.aborts.fetch_add(1);
  dropped.swap(e.idle);
  for (WireSocket* socket : e.live) socket->Shutdown();
}

void TcpPsTransport::Release(int ps, std::unique_ptr<Connection> connection) {
  Endpoint& e = *endpoints_[ps];
  absl::MutexLock lock(&e.mu);
  if (connection->epoch != e.epoch) return;           // to an address no longer the task's
  if (connection->aborts != e.aborts.load()) return;  // shut down by AbortCalls meanwhile
  e.idle.push_back(std::move(connection));
}

void TcpPsTransport::Forget(int ps) {
  Endpoint& e = *endpoints_[ps];
  std::vector<std::unique_ptr<Connection>> dropped;
  absl::MutexLock lock(&e.mu);
  e.port = 0;
  dropped.swap(e.idle);
}

absl::Status TcpPsTransport::CallOn(Connection& c, Exchange* x, bool* in_step) {
  *in_step = false;
  char raw[kFrameHeaderBytes];
  uint64_t payload = x->streamed_payload_bytes;
  for (const iovec& v : x->payload) payload += v.iov_len;
  x->request.meta_bytes = static_cast<uint32_t>(x->meta.size());
  x->request.payload_bytes = payload;
  EncodeFrameHeader(x->request, raw);
  std::vector<iovec> iov;
  iov.reserve(2 + x->payload.size());
  iov.push_back(Bytes(raw, sizeof(raw)));
  iov.push_back(Bytes(x->meta.data(), static_cast<int64_t>(x->meta.size())));
  if (x->write_payload) {
    PS_RETURN_IF_ERROR(x->write_payload(*c.socket, &iov));
  } else {
    iov.insert(iov.end(), x->payload.begin(), x->payload.end());
    PS_RETURN_IF_ERROR(
        c.socket->WriteAll(iov.data(), static_cast<int>(iov.size()), options_.io_timeout));
  }
  return ReadAnswer(c, x, in_step);
}

absl::Status TcpPsTransport::ReadAnswer(Connection& c, Exchange* x, bool* in_step) {
  *in_step = false;
  char raw[kFrameHeaderBytes];
  PS_RETURN_IF_ERROR(c.socket->ReadExact(raw, kFrameHeaderBytes, options_.io_timeout));
  PS_ASSIGN_OR_RETURN(FrameHeader response, DecodeFrameHeader(raw));
  if (response.op != (x->request.op | kResponseBit) || response.tag != x->request.tag) {
    return absl::DataLossError(absl::StrCat("answer ", WireOpName(response.op), " tag ",
                                            response.tag, " to request ", WireOpName(x->request.op),
                                            " tag ", x->request.tag));
  }
  if (response.meta_bytes > (16u << 20)) {
    return absl::DataLossError(
        absl::StrCat("an answer with ", response.meta_bytes, " bytes of meta"));
  }
  x->response_meta.resize(response.meta_bytes);
  PS_RETURN_IF_ERROR(
      c.socket->ReadExact(x->response_meta.data(), response.meta_bytes, options_.io_timeout));
  if (response.status != 0) {
    // The ps's own error: the connection stays in step (an error carries no payload).
    *in_step = response.payload_bytes == 0;
    if (!*in_step) return absl::DataLossError("an error answer with a payload");
    return WireErrorStatus(response.status, x->response_meta);
  }
  absl::Status s;
  if (x->read_payload) {
    s = x->read_payload(*c.socket, response.payload_bytes, c);
  } else if (response.payload_bytes != 0) {
    s = absl::DataLossError(
        absl::StrCat("an unexpected payload of ", response.payload_bytes, " bytes"));
  }
  *in_step = s.ok();
  return s;
}

absl::Status TcpPsTransport::Call(int ps, Exchange* x, bool* no_data_plane) {
  *no_data_plane = false;
  x->request.tag = next_tag_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t aborts = endpoints_[ps]->aborts.load();
  for (int attempt = 0;; ++attempt) {
    bool pooled = false;
    absl::StatusOr<std::unique_ptr<Connection>> c = Acquire(ps, &pooled, &aborts);
    if (!c.ok()) {
      Forget(ps);
      return Annotate(ps, c.status());
    }
    if (*c == nullptr) {
      *no_data_plane = true;
      return absl::OkStatus();
    }
    bool in_step = false;
    absl::Status s = CallOn(**c, x, &in_step);
    if (in_step) {
      Release(ps, *std::move(c));
      return Annotate(ps, s);
    }
    // The connection is out of step (an I/O failure or a garbled answer): drop it, and the
    // pool with it, since the ps may have restarted.
    Forget(ps);
    if (endpoints_[ps]->aborts.load() != aborts) {
      return Annotate(ps,
                      absl::UnavailableError(absl::StrCat(Ended().message(), ": ", s.message())));
    }
    // A pooled connection may have died with a restarted ps: one more try on a new one.
    if (!pooled || attempt > 0 || absl::IsDeadlineExceeded(s)) return Annotate(ps, s);
  }
}

absl::Status TcpPsTransport::PullDense(int ps, const std::vector<DenseSlice>& slices,
                                       v1::DataType wire_dtype, int64_t step) {
  const v1::DataType wire = WireOrFloat(wire_dtype);
  PS_ASSIGN_OR_RETURN(const int elem, WireBytesPerElement(wire));
  int64_t total = 0;
  for (const DenseSlice& s : slices) total += s.num_elements;
  int stripes =
      static_cast<int>(std::min<int64_t>(pull_stripes_, total * elem / pull_stripe_bytes_));
  ThreadPool* pool = nullptr;
  if (stripes > 1) {
    // Only to a ps that serves ranges, as far as its last lookup said (the first pull to a
    // task, which looks it up, goes whole).
    Endpoint& e = *endpoints_[ps];
    absl::MutexLock lock(&e.mu);
    if (!e.ranges || e.port <= 0) {
      stripes = 1;
    } else {
      if (e.stripe_pool == nullptr) e.stripe_pool = std::make_unique<ThreadPool>(pull_stripes_ - 1);
      pool = e.stripe_pool.get();  // (never freed before the transport)
    }
  }
  bool no_data_plane = false;
  if (stripes <= 1) {
    absl::Status s = PullDenseOnce(ps, slices, {}, wire, step, &no_data_plane);
    if (no_data_plane) return grpc_->PullDense(ps, slices, wire_dtype, step);
    return s;
  }
  // Stripes of about total / stripes elements each, in order: a slice may be cut between two.
  std::vector<std::vector<DenseSlice>> parts(stripes);
  std::vector<std::vector<int64_t>> begins(stripes);
  {
    size_t slice = 0;
    int64_t at = 0;  // within slices[slice]
    for (int k = 0; k < stripes; ++k) {
      int64_t want = total * (k + 1) / stripes - total * k / stripes;
      while (want > 0) {
        const DenseSlice& s = slices[slice];
        const int64_t take = std::min(want, s.num_elements - at);
        if (take > 0) {  // (an empty shard has nothing to pull)
          DenseSlice part = s;
          part.num_elements = take;
          part.pull_into = s.pull_into + at;
          parts[k].push_back(part);
          begins[k].push_back(at);
        }
        at += take;
        want -= take;
        if (at == s.num_elements) {
          ++slice;
          at = 0;
        }
      }
    }
  }
  std::vector<absl::Status> status(stripes);
  std::unique_ptr<bool[]> none(new bool[stripes]());
  absl::BlockingCounter others(stripes - 1);
  for (int k = 1; k < stripes; ++k) {
    pool->Schedule([&, k] {
      status[k] = PullDenseOnce(ps, parts[k], begins[k], wire, step, &none[k]);
      others.DecrementCount();
    });
  }
  status[0] = PullDenseOnce(ps, parts[0], begins[0], wire, step, &none[0]);
  others.Wait();
  for (int k = 0; k < stripes; ++k) no_data_plane |= none[k];
  if (no_data_plane) return grpc_->PullDense(ps, slices, wire_dtype, step);
  for (const absl::Status& s : status) PS_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status TcpPsTransport::PullDenseOnce(int ps, const std::vector<DenseSlice>& slices,
                                           const std::vector<int64_t>& begins, v1::DataType wire,
                                           int64_t step, bool* no_data_plane) {
  PS_ASSIGN_OR_RETURN(const int elem, WireBytesPerElement(wire));
  Exchange x;
  x.request.op = static_cast<uint16_t>(WireOp::kPullDense);
  v1::PullDenseRequest req;
  int64_t total = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const DenseSlice& s = slices[i];
    *req.add_shards() = s.ref;
    total += s.num_elements;
    if (!begins.empty()) {
      req.add_element_begin(begins[i]);
      req.add_element_end(begins[i] + s.num_elements);
    }
  }
  req.set_wire_dtype(wire);
  if (step >= 0) req.set_step(step);
  x.meta = req.SerializeAsString();
  x.read_payload = [&](WireSocket& socket, uint64_t bytes, Connection& c) -> absl::Status {
    if (bytes != static_cast<uint64_t>(total * elem)) {
      return absl::DataLossError(absl::StrCat(
          "the pull's answer carries ", bytes, " bytes; the ", slices.size(), " shards asked for ",
          "hold ", total * elem, " (is the caller's placement out of date?)"));
    }
    for (const DenseSlice& s : slices) {
      PS_RETURN_IF_ERROR(ReadFloats(socket, s.num_elements * elem, s.num_elements, wire,
                                    s.pull_into, &c.scratch, options_.io_timeout));
    }
    return absl::OkStatus();
  };
  return Call(ps, &x, no_data_plane);
}

absl::Status TcpPsTransport::PushDense(int ps, const std::vector<DenseSlice>& slices,
                                       const PushMeta& meta, v1::PushDenseResponse* response) {
  const v1::DataType wire = WireOrFloat(meta.wire_dtype);
  PS_ASSIGN_OR_RETURN(const int elem, WireBytesPerElement(wire));
  Exchange x;
  x.request.op = static_cast<uint16_t>(WireOp::kPushDense);
  v1::PushDenseHeader header;
  int64_t total = 0;
  for (const DenseSlice& s : slices) {
    *header.add_shards() = s.ref;
    header.add_num_elements(s.num_elements);
    total += s.num_elements;
  }
  header.set_wire_dtype(wire);
  header.set_step(meta.step);
  header.set_worker(meta.worker);
  header.set_delta(meta.delta);
  *header.mutable_request_id() = meta.request_id;
  x.meta = header.SerializeAsString();
  // float32 gradients are sent from the caller's memory; others are encoded first.
  std::string encoded;
  if (wire == v1::DT_FLOAT32) {
    for (const DenseSlice& s : slices) x.payload.push_back(Bytes(s.push_from, s.num_elements * 4));
  } else {
    encoded.resize(total * elem);
    int64_t at = 0;
    for (const DenseSlice& s : slices) {
      EncodeFloatsTo(s.push_from, s.num_elements, wire, encoded.data() + at);
      at += s.num_elements * elem;
    }
    x.payload.push_back(Bytes(encoded.data(), static_cast<int64_t>(encoded.size())));
  }
  bool no_data_plane = false;
  absl::Status s = Call(ps, &x, &no_data_plane);
  if (no_data_plane) return grpc_->PushDense(ps, slices, meta, response);
  PS_RETURN_IF_ERROR(s);
  if (!response->ParseFromString(x.response_meta)) {
    return Annotate(ps, absl::DataLossError("the push's answer is not a PushDenseResponse"));
  }
  return absl::OkStatus();
}

absl::Status TcpPsTransport::Replicate(int ps, const v1::ReplicateHeader& header,
                                       const std::vector<absl::Span<const float>>& grads,
                                       v1::ReplicateResponse* response, bool* no_data_plane) {
  Exchange x;
  x.request.op = static_cast<uint16_t>(WireOp::kReplicate);
  x.meta = header.SerializeAsString();
  for (absl::Span<const float> g : grads) {
    x.payload.push_back(Bytes(g.data(), static_cast<int64_t>(g.size() * sizeof(float))));
  }
  absl::Status s = Call(ps, &x, no_data_plane);
  if (*no_data_plane) return absl::OkStatus();
  PS_RETURN_IF_ERROR(s);
  if (!response->ParseFromString(x.response_meta)) {
    return Annotate(ps, absl::DataLossError("the forward's answer is not a ReplicateResponse"));
  }
  return absl::OkStatus();
}

absl::Status TcpPsTransport::ReplicateSparse(int ps, int32_t primary_ps_task,
                                             const v1::ReplicateSparseRequest& request,
                                             v1::ReplicateSparseResponse* response,
                                             bool* no_data_plane) {
  Exchange x;
  x.request.op = static_cast<uint16_t>(WireOp::kReplicateSparse);
  v1::ReplicateSparseRequest meta;
  meta.set_table(request.table());
  *meta.mutable_request_id() = request.request_id();
  *meta.mutable_groups() = request.groups();
  meta.set_accepted_rows(request.accepted_rows());
  meta.set_primary_ps_task(primary_ps_task);
  x.meta = meta.SerializeAsString();
  x.payload.push_back(Bytes(request.keys().data(), static_cast<int64_t>(request.keys().size())));
  x.payload.push_back(
      Bytes(request.gradients().data(), static_cast<int64_t>(request.gradients().size())));
  absl::Status s = Call(ps, &x, no_data_plane);
  if (*no_data_plane) return absl::OkStatus();
  PS_RETURN_IF_ERROR(s);
  if (!response->ParseFromString(x.response_meta)) {
    return Annotate(ps,
                    absl::DataLossError("the forward's answer is not a ReplicateSparseResponse"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TcpPsTransport::ReplicateStream>>
TcpPsTransport::OpenReplicateStream(int ps, const v1::ReplicateHeader& header, int64_t values) {
  bool pooled = false;
  absl::StatusOr<std::unique_ptr<Connection>> c = Acquire(ps, &pooled);
  if (!c.ok()) {
    Forget(ps);
    return Annotate(ps, c.status());
  }
  if (*c == nullptr) return nullptr;
  std::unique_ptr<ReplicateStream> stream(new ReplicateStream(this, ps));
  stream->connection_ = *std::move(c);
  FrameHeader request;
  request.op = static_cast<uint16_t>(WireOp::kReplicateStream);
  request.tag = next_tag_.fetch_add(1, std::memory_order_relaxed);
  const std::string meta = header.SerializeAsString();
  request.meta_bytes = static_cast<uint32_t>(meta.size());
  request.payload_bytes = static_cast<uint64_t>(values) * sizeof(float);
  char raw[kFrameHeaderBytes];
  EncodeFrameHeader(request, raw);
  iovec iov[2] = {Bytes(raw, sizeof(raw)), Bytes(meta.data(), static_cast<int64_t>(meta.size()))};
  absl::Status s = stream->connection_->socket->WriteAll(iov, 2, options_.io_timeout);
  if (!s.ok()) {
    Forget(ps);
    return Annotate(ps, s);
  }
  return stream;
}

TcpPsTransport::ReplicateStream::~ReplicateStream() {
  // Unanswered: the backup is mid-request; closing the connection abandons it there.
  if (!answered_ && connection_ != nullptr) connection_->socket->Shutdown();
}

void TcpPsTransport::ReplicateStream::Abort() { connection_->socket->Shutdown(); }

absl::Status TcpPsTransport::ReplicateStream::Write(const float* values, int64_t n) {
  iovec iov = Bytes(values, n * static_cast<int64_t>(sizeof(float)));
  return transport_->Annotate(
      ps_, connection_->socket->WriteAll(&iov, 1, transport_->options_.io_timeout));
}

absl::Status TcpPsTransport::ReplicateStream::Commit(const v1::ReplicateHeader& header) {
  FrameHeader request;
  request.op = static_cast<uint16_t>(WireOp::kReplicateCommit);
  tag_ = transport_->next_tag_.fetch_add(1, std::memory_order_relaxed);
  request.tag = tag_;
  const std::string meta = header.SerializeAsString();
  request.meta_bytes = static_cast<uint32_t>(meta.size());
  char raw[kFrameHeaderBytes];
  EncodeFrameHeader(request, raw);
  iovec iov[2] = {Bytes(raw, sizeof(raw)), Bytes(meta.data(), static_cast<int64_t>(meta.size()))};
  return transport_->Annotate(
      ps_, connection_->socket->WriteAll(iov, 2, transport_->options_.io_timeout));
}

absl::Status TcpPsTransport::ReplicateStream::Await(v1::ReplicateResponse* response) {
  Exchange x;
  x.request.op = static_cast<uint16_t>(WireOp::kReplicateCommit);
  x.request.tag = tag_;
  bool in_step = false;
  absl::Status s = transport_->ReadAnswer(*connection_, &x, &in_step);
  if (s.ok() && !response->ParseFromString(x.response_meta)) {
    s = absl::DataLossError("the forward's answer is not a ReplicateResponse");
  }
  if (in_step && s.ok()) {
    answered_ = true;
    transport_->Release(ps_, std::move(connection_));
  }
  return transport_->Annotate(ps_, s);
}

absl::Status TcpPsTransport::PullSparse(int ps, const std::string& table, const int64_t* keys,
                                        int64_t n, int64_t dim, v1::DataType wire_dtype,
                                        int64_t step, float* out) {
  const v1::DataType wire = WireOrFloat(wire_dtype);
  PS_RETURN_IF_ERROR(WireBytesPerElement(wire).status());
  Exchange x;
  x.request.op = static_cast<uint16_t>(WireOp::kPullSparse);
  v1::PullSparseRequest req;
  req.set_table(table);
  req.set_wire_dtype(wire);
  if (step >= 0) req.set_step(step);
  x.meta = req.SerializeAsString();
  x.payload.push_back(Bytes(keys, n * static_cast<int64_t>(sizeof(int64_t))));
  x.read_payload = [&](WireSocket& socket, uint64_t bytes, Connection& c) -> absl::Status {
    return ReadFloats(socket, bytes, n * dim, wire, out, &c.scratch, options_.io_timeout);
  };
  bool no_data_plane = false;
  absl::Status s = Call(ps, &x, &no_data_plane);
  if (no_data_plane) return grpc_->PullSparse(ps, table, keys, n, dim, wire_dtype, step, out);
  return s;
}

absl::Status TcpPsTransport::PushSparse(int ps, const std::string& table, const int64_t* keys,
                                        int64_t n, int64_t dim, const float* grads,
                                        const PushMeta& meta, v1::PushSparseResponse* response) {
  const v1::DataType wire = WireOrFloat(meta.wire_dtype);
  PS_ASSIGN_OR_RETURN(const int elem, WireBytesPerElement(wire));
  Exchange x;
  x.request.op = static_cast<uint16_t>(WireOp::kPushSparse);
  x.meta = PushSparseMeta(table, wire, meta, n);
  x.payload.push_back(Bytes(keys, n * static_cast<int64_t>(sizeof(int64_t))));
  std::string encoded;
  if (wire == v1::DT_FLOAT32) {
    x.payload.push_back(Bytes(grads, n * dim * 4));
  } else {
    encoded.resize(n * dim * elem);
    EncodeFloatsTo(grads, n * dim, wire, encoded.data());
    x.payload.push_back(Bytes(encoded.data(), static_cast<int64_t>(encoded.size())));
  }
  bool no_data_plane = false;
  absl::Status s = Call(ps, &x, &no_data_plane);
  if (no_data_plane) return grpc_->PushSparse(ps, table, keys, n, dim, grads, meta, response);
  PS_RETURN_IF_ERROR(s);
  if (!response->ParseFromString(x.response_meta)) {
    return Annotate(ps, absl::DataLossError("the push's answer is not a PushSparseResponse"));
  }
  return absl::OkStatus();
}

absl::Status TcpPsTransport::PushSparseGather(int ps, const std::string& table, const int64_t* keys,
                                              const int64_t* positions, int64_t n, int64_t dim,
                                              const float* grads, const PushMeta& meta,
                                              v1::PushSparseResponse* response) {
  const v1::DataType wire = WireOrFloat(meta.wire_dtype);
  PS_ASSIGN_OR_RETURN(const int elem, WireBytesPerElement(wire));
  Exchange x;
  x.request.op = static_cast<uint16_t>(WireOp::kPushSparse);
  x.meta = PushSparseMeta(table, wire, meta, n);
  x.streamed_payload_bytes = static_cast<uint64_t>(n * (int64_t{sizeof(int64_t)} + dim * elem));
  const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(float));
  const int64_t piece_bytes =
      std::max({options_.gather_piece_bytes, row_bytes, static_cast<int64_t>(sizeof(int64_t))});
  const int64_t keys_per_piece = piece_bytes / static_cast<int64_t>(sizeof(int64_t));
  const int64_t rows_per_piece = piece_bytes / row_bytes;
  x.write_payload = [&](WireSocket& socket, std::vector<iovec>* head) -> absl::Status {
    // This thread's pieces, kept from call to call. Each WriteAll has copied its piece into
    // the socket by the time it returns, so the next piece may overwrite it.
    thread_local std::vector<int64_t> key_piece;
    thread_local std::vector<float> row_piece;
    thread_local std::string encoded;
    if (key_piece.size() < static_cast<size_t>(keys_per_piece)) {
      key_piece.resize(static_cast<size_t>(keys_per_piece));
    }
    if (row_piece.size() < static_cast<size_t>(rows_per_piece * dim)) {
      row_piece.resize(static_cast<size_t>(rows_per_piece * dim));
    }
    // One deadline for the whole frame, as a frame written at once has.
    const absl::Time deadline = absl::Now() + options_.io_timeout;
    const auto write = [&](const void* p, int64_t bytes) {
      head->push_back(Bytes(p, bytes));
      absl::Status s =
          socket.WriteAll(head->data(), static_cast<int>(head->size()), deadline - absl::Now());
      head->clear();
      return s;
    };
    for (int64_t begin = 0; begin < n; begin += keys_per_piece) {
      const int64_t count = std::min(keys_per_piece, n - begin);
      GatherKeys(keys, positions + begin, count, key_piece.data());
      PS_RETURN_IF_ERROR(write(key_piece.data(), count * int64_t{sizeof(int64_t)}));
    }
    for (int64_t begin = 0; begin < n; begin += rows_per_piece) {
      const int64_t count = std::min(rows_per_piece, n - begin);
      GatherRows(grads, positions + begin, count, dim, row_piece.data());
      if (wire == v1::DT_FLOAT32) {
        PS_RETURN_IF_ERROR(write(row_piece.data(), count * row_bytes));
      } else {
        encoded.resize(static_cast<size_t>(count * dim * elem));
        EncodeFloatsTo(row_piece.data(), count * dim, wire, encoded.data());
        PS_RETURN_IF_ERROR(write(encoded.data(), count * dim * elem));
      }
    }
    if (head->empty()) return absl::OkStatus();  // no keys: the head alone
    return write(nullptr, 0);
  };
  bool no_data_plane = false;
  absl::Status s = Call(ps, &x, &no_data_plane);
  if (no_data_plane) {
    // Over gRPC, which takes the part whole.
    return grpc_->PushSparseGather(ps, table, keys, positions, n, dim, grads, meta, response);
  }
  PS_RETURN_IF_ERROR(s);
  if (!response->ParseFromString(x.response_meta)) {
    return Annotate(ps, absl::DataLossError("the push's answer is not a PushSparseResponse"));
  }
  return absl::OkStatus();
}

absl::Status TcpPsTransport::CreateShards(int ps, const v1::CreateShardsRequest& request,
                                          v1::CreateShardsResponse* response) {
  return grpc_->CreateShards(ps, request, response);
}

absl::StatusOr<v1::ListShardsResponse> TcpPsTransport::ListShards(
    int ps, const v1::ListShardsRequest& request) {
  return grpc_->ListShards(ps, request);
}

absl::StatusOr<v1::InspectShardResponse> TcpPsTransport::InspectShard(
    int ps, const v1::InspectShardRequest& request) {
  return grpc_->InspectShard(ps, request);
}

absl::Status TcpPsTransport::SaveShards(int ps, const v1::SaveShardsRequest& request,
                                        v1::SaveShardsResponse* response) {
  return grpc_->SaveShards(ps, request, response);
}

absl::Status TcpPsTransport::RestoreShards(int ps, const v1::RestoreShardsRequest& request,
                                           v1::RestoreShardsResponse* response) {
  return grpc_->RestoreShards(ps, request, response);
}

absl::StatusOr<v1::TaskStatus> TcpPsTransport::GetStatus(int ps) { return grpc_->GetStatus(ps); }

absl::Status TcpPsTransport::FailOverPs(int ps, const v1::FailOverPsRequest& request,
                                        v1::FailOverPsResponse* response) {
  return grpc_->FailOverPs(ps, request, response);
}

absl::Status TcpPsTransport::RebuildBackup(int ps, const v1::RebuildBackupRequest& request,
                                           v1::RebuildBackupResponse* response) {
  return grpc_->RebuildBackup(ps, request, response);
}

}  // namespace pscluster
