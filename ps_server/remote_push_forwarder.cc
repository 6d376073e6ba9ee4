#include "ps_server/remote_push_forwarder.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/grpc_ps_transport.h"
#include "common/grpc_status.h"
#include "common/log_once.h"
#include "glog/logging.h"
#include "security/wire_tls.h"

namespace pscluster {

RemotePushForwarder::RemotePushForwarder(int self, TlsConfig tls, absl::Duration timeout)
    : self_(self), tls_(std::move(tls)), timeout_(timeout), writers_(StreamWriters()) {}

int RemotePushForwarder::StreamWriters() {
  const int by_cores = std::thread::hardware_concurrency() >= 8 ? kStreamWriters : 0;
  const char* env = std::getenv("PSCLUSTER_FORWARD_WRITERS");
  if (env == nullptr || *env == '\0') return by_cores;
  int n = 0;
  if (!absl::SimpleAtoi(env, &n) || n < 0 || n > 16) {
    LOG(ERROR) << "PSCLUSTER_FORWARD_WRITERS is \"" << env
               << "\"; expected a thread count from 0 to 16; using " << by_cores;
    return by_cores;
  }
  return n;
}

void RemotePushForwarder::SetAddresses(const std::vector<std::string>& addresses) {
  absl::MutexLock lock(&mu_);
  if (peers_ != nullptr && peers_->addresses == addresses) return;
  auto peers = std::make_shared<Peers>();
  peers->addresses = addresses;
  GrpcPsTransportOptions grpc;
  grpc.tls = tls_;
  grpc.rpc_timeout = timeout_;
  TcpPsTransportOptions wire;
  wire.io_timeout = timeout_;
  if (tls_.enabled() && wire_tls_ == nullptr) {
    absl::StatusOr<std::shared_ptr<WireTlsContext>> context =
        WireTlsContext::Create(tls_, WireTlsContext::Side::kClient);
    if (context.ok()) {
      wire_tls_ = *std::move(context);
    } else {
      LOG(ERROR) << "forwards to backups: no TLS context for the data plane (" << context.status()
                 << "); they go over gRPC";
    }
  }
  wire.tls = wire_tls_;
  if (!tls_.enabled() || wire_tls_ != nullptr) {
    peers->wire = std::make_unique<TcpPsTransport>(
        std::make_unique<GrpcPsTransport>(addresses, grpc), addresses, wire);
  }
  peers_ = std::move(peers);
}

namespace {

// A ForwardStream over TcpPsTransport's ReplicateStream whose writes are made by a writer
// thread (of `writers`), in order, so that the thread receiving the push does not also send it:
// Write() queues the piece (the push's buffer stays put until FinishPushDense returns), Commit()
// queues the commit behind the pieces (the primary commits under its shards' locks, so it never
// waits here for the backup), Await() waits for the queue to drain first.
class WireForwardStream : public ForwardStream {
 public:
  WireForwardStream(std::shared_ptr<void> keep,
                    std::unique_ptr<TcpPsTransport::ReplicateStream> stream, ThreadPool* writers)
      : keep_(std::move(keep)), stream_(std::move(stream)), writers_(writers) {}
  ~WireForwardStream() override {
    absl::MutexLock lock(&mu_);
    if (writing_) {
      queue_.clear();
      stream_->Abort();  // a write blocked on the backup returns at once
      mu_.Await(absl::Condition(
          +[](bool* writing) { return !*writing; }, &writing_));
    }
  }
  absl::Status Write(const float* values, int64_t n) override { return Queue({values, n, {}}); }
  absl::Status Commit(const v1::ReplicateHeader& header) override {
    return Queue({nullptr, 0, header, /*commit=*/true});
  }
  // Without writer threads Queue() writes at once, on the caller's thread.
  bool CommitQueues() const override { return writers_->num_threads() > 0; }
  absl::Status Await(v1::ReplicateResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](bool* writing) { return !*writing; }, &writing_));
      if (!error_.ok()) return error_;
    }
    return stream_->Await(response);
  }

 private:
  struct Item {
    const float* values;
    int64_t n;
    v1::ReplicateHeader header;  // a commit's
    bool commit = false;
  };
  absl::Status Queue(Item item) {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      if (!error_.ok()) return error_;
      queue_.push_back(std::move(item));
      start = !writing_;
      writing_ = true;
    }
    // Without writer threads (a small machine) the item is written here, at once.
    if (start) writers_->Schedule([this] { Drain(); });
    return absl::OkStatus();
  }
  void Drain() {
    mu_.Lock();
    while (!queue_.empty() && error_.ok()) {
      const Item item = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      absl::Status s =
          item.commit ? stream_->Commit(item.header) : stream_->Write(item.values, item.n);
      mu_.Lock();
      if (!s.ok() && error_.ok()) error_ = s;
    }
    writing_ = false;
    mu_.Unlock();
  }

  std::shared_ptr<void> keep_;  // the peers whose transport the stream uses
  std::unique_ptr<TcpPsTransport::ReplicateStream> stream_;
  ThreadPool* const writers_;
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // a Drain is scheduled or running
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ForwardStream> RemotePushForwarder::OpenStream(int backup,
                                                               const v1::ReplicateHeader& header,
                                                               int64_t values) {
  std::shared_ptr<Peers> peers = this->peers();
  if (peers == nullptr || peers->wire == nullptr || backup < 0 ||
      backup >= static_cast<int>(peers->addresses.size())) {
    return nullptr;
  }
  v1::ReplicateHeader h = header;
  h.set_primary_ps_task(self_);
  absl::StatusOr<std::unique_ptr<TcpPsTransport::ReplicateStream>> stream =
      peers->wire->OpenReplicateStream(backup, h, values);
  if (!stream.ok() || *stream == nullptr) return nullptr;
  PS_LOG_FIRST_N(INFO, 1) << "forwarding updates to the backups over their tensor data plane, "
                             "while the pushes arrive";
  return std::make_unique<WireForwardStream>(peers, *std::move(stream), &writers_);
}

absl::Status RemotePushForwarder::ForwardOne(const DenseForward& forward) {
  std::shared_ptr<Peers> peers = this->peers();
  if (peers == nullptr || forward.backup < 0 ||
      forward.backup >= static_cast<int>(peers->addresses.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("no address for backup ps:", forward.backup,
                     " (CreateShardsRequest.ps_addresses did not name it)"));
  }
  v1::ReplicateHeader header = forward.header;
  header.set_primary_ps_task(self_);
  if (peers->wire != nullptr) {
    v1::ReplicateResponse response;
    bool no_data_plane = false;
    absl::Status s =
        peers->wire->Replicate(forward.backup, header, forward.grads, &response, &no_data_plane);
    if (!no_data_plane) {
      PS_LOG_FIRST_N(INFO, 1) << "forwarding updates to the backups over their tensor data plane";
      return s;
    }
  }
  PS_LOG_FIRST_N(INFO, 1) << "forwarding updates to backup ps:" << forward.backup
                          << " over gRPC (it has no tensor data plane)";
  return ForwardOverGrpc(forward, header);
}

std::shared_ptr<v1::ParameterServer::Stub> RemotePushForwarder::StubFor(
    const std::shared_ptr<Peers>& peers, int backup) {
  if (peers == nullptr || backup < 0 || backup >= static_cast<int>(peers->addresses.size())) {
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  std::shared_ptr<v1::ParameterServer::Stub>& slot = peers->stubs[backup];
  if (slot == nullptr) {
    GrpcChannelOptions channel;
    channel.tls = tls_;
    channel.fast_reconnect = true;
    slot = v1::ParameterServer::NewStub(NewGrpcChannel(peers->addresses[backup], channel));
  }
  return slot;
}

absl::Status RemotePushForwarder::ForwardSparse(int backup,
                                                const v1::ReplicateSparseRequest& request) {
  std::shared_ptr<Peers> peers = this->peers();
  if (peers != nullptr && peers->wire != nullptr && backup >= 0 &&
      backup < static_cast<int>(peers->addresses.size())) {
    v1::ReplicateSparseResponse response;
    bool no_data_plane = false;
    absl::Status s =
        peers->wire->ReplicateSparse(backup, self_, request, &response, &no_data_plane);
    if (!no_data_plane) {
      PS_LOG_FIRST_N(INFO, 1) << "forwarding table updates to the backups over their tensor "
                                 "data plane";
      return s;
    }
  }
  std::shared_ptr<v1::ParameterServer::Stub> stub = StubFor(peers, backup);
  if (stub == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no address for backup ps:", backup,
                     " (CreateShardsRequest.ps_addresses did not name it)"));
  }
  v1::ReplicateSparseRequest req = request;
  req.set_primary_ps_task(self_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(absl::ToInt64Microseconds(timeout_)));
  v1::ReplicateSparseResponse response;
  const grpc::Status s = stub->ReplicateSparse(&ctx, req, &response);
  PS_LOG_FIRST_N(INFO, 1) << "forwarding table updates to the backups over gRPC";
  if (!s.ok()) {
    return absl::Status(FromGrpcStatus(s).code(),
                        absl::StrCat("forward to backup ps:", backup, ": ", s.error_message()));
  }
  return absl::OkStatus();
}

void RemotePushForwarder::AbortCalls(int backup) {
  std::shared_ptr<Peers> p = peers();
  if (p == nullptr || p->wire == nullptr || backup < 0 ||
      backup >= static_cast<int>(p->addresses.size())) {
    return;
  }
  p->wire->AbortCalls(backup);
}

absl::Status RemotePushForwarder::SendReplica(int backup, const v1::DenseReplica& replica,
                                              bool* installed, std::atomic<int64_t>* sent) {
  *installed = false;
  std::shared_ptr<v1::ParameterServer::Stub> stub = StubFor(peers(), backup);
  if (stub == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no address for ps:", backup, " (RebuildBackupRequest.ps_addresses)"));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(absl::ToInt64Microseconds(timeout_)));
  v1::InstallReplicaResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::InstallReplicaRequest>> writer =
      stub->InstallReplica(&ctx, &response);
  const std::string& bytes = replica.values_and_slots();
  v1::InstallReplicaRequest first;
  first.set_primary_ps_task(self_);
  first.set_total_bytes(static_cast<int64_t>(bytes.size()));
  v1::DenseReplica* head = first.mutable_replica();
  *head->mutable_shard() = replica.shard();
  head->set_updates(replica.updates());
  *head->mutable_ledger() = replica.ledger();
  *head->mutable_ledger_floors() = replica.ledger_floors();
  bool written = writer->Write(first);
  v1::InstallReplicaRequest msg;
  for (size_t offset = 0; written && offset < bytes.size(); offset += kChunkBytes) {
    const size_t n = std::min<size_t>(kChunkBytes, bytes.size() - offset);
    msg.set_data(bytes.data() + offset, n);
    written = writer->Write(msg);
    if (written && sent != nullptr) sent->fetch_add(static_cast<int64_t>(n));
  }
  if (written) writer->WritesDone();
  const grpc::Status s = writer->Finish();
  if (!s.ok()) {
    return absl::Status(FromGrpcStatus(s).code(),
                        absl::StrCat("copy to ps:", backup, ": ", s.error_message()));
  }
  *installed = response.installed();
  return absl::OkStatus();
}

absl::Status RemotePushForwarder::SendTableReplica(int backup, const v1::TableReplica& replica,
                                                   absl::Span<const int64_t> keys,
                                                   absl::Span<const int64_t> counts,
                                                   absl::Span<const float> rows, bool* installed,
                                                   std::atomic<int64_t>* sent) {
  *installed = false;
  std::shared_ptr<v1::ParameterServer::Stub> stub = StubFor(peers(), backup);
  if (stub == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no address for ps:", backup, " (RebuildBackupRequest.ps_addresses)"));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(absl::ToInt64Microseconds(timeout_)));
  v1::InstallReplicaResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::InstallReplicaRequest>> writer =
      stub->InstallReplica(&ctx, &response);
  // The keys, then the counts, then the rows, in messages of up to kChunkBytes.
  const absl::string_view parts[] = {
      {reinterpret_cast<const char*>(keys.data()), keys.size() * sizeof(int64_t)},
      {reinterpret_cast<const char*>(counts.data()), counts.size() * sizeof(int64_t)},
      {reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(float)}};
  v1::InstallReplicaRequest first;
  first.set_primary_ps_task(self_);
  *first.mutable_table_replica() = replica;
  first.set_total_bytes(static_cast<int64_t>(parts[0].size() + parts[1].size() + parts[2].size()));
  bool written = writer->Write(first);
  v1::InstallReplicaRequest msg;
  for (absl::string_view part : parts) {
    for (size_t offset = 0; written && offset < part.size(); offset += kChunkBytes) {
      const size_t n = std::min<size_t>(kChunkBytes, part.size() - offset);
      msg.set_data(part.data() + offset, n);
      written = writer->Write(msg);
      if (written && sent != nullptr) sent->fetch_add(static_cast<int64_t>(n));
    }
  }
  if (written) writer->WritesDone();
  const grpc::Status s = writer->Finish();
  if (!s.ok()) {
    return absl::Status(FromGrpcStatus(s).code(),
                        absl::StrCat("copy of table ", replica.table(), "'s stripe ",
                                     replica.stripe(), " to ps:", backup, ": ", s.error_message()));
  }
  *installed = response.installed();
  return absl::OkStatus();
}

absl::Status RemotePushForwarder::ForwardOverGrpc(const DenseForward& forward,
                                                  const v1::ReplicateHeader& header) {
  std::shared_ptr<v1::ParameterServer::Stub> stub = StubFor(peers(), forward.backup);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(absl::ToInt64Microseconds(timeout_)));
  v1::ReplicateResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ReplicateRequest>> writer =
      stub->Replicate(&ctx, &response);
  v1::ReplicateRequest msg;
  *msg.mutable_header() = header;
  bool sent = writer->Write(msg);
  const int64_t per_chunk = kChunkBytes / static_cast<int64_t>(sizeof(float));
  for (size_t i = 0; sent && i < forward.grads.size(); ++i) {
    const absl::Span<const float> grad = forward.grads[i];
    const int64_t n = static_cast<int64_t>(grad.size());
    for (int64_t offset = 0; sent && offset < n; offset += per_chunk) {
      const int64_t count = std::min(per_chunk, n - offset);
      v1::TensorChunk* chunk = msg.mutable_chunk();
      chunk->set_index(static_cast<int32_t>(i));
      chunk->set_offset(offset);
      chunk->set_data(reinterpret_cast<const char*>(grad.data() + offset),
                      static_cast<size_t>(count) * sizeof(float));
      sent = writer->Write(msg);
    }
  }
  if (sent) writer->WritesDone();
  const grpc::Status s = writer->Finish();
  if (!s.ok()) {
    return absl::Status(
        FromGrpcStatus(s).code(),
        absl::StrCat("forward to backup ps:", forward.backup, ": ", s.error_message()));
  }
  return absl::OkStatus();
}

absl::Status RemotePushForwarder::Forward(const ForwardList& list) {
  const size_t n = list.forwards.size();
  if (n == 1) return ForwardOne(list.forwards[0]);
  std::vector<absl::Status> results(n);
  std::vector<std::thread> others;
  for (size_t i = 1; i < n; ++i) {
    others.emplace_back([&, i] { results[i] = ForwardOne(list.forwards[i]); });
  }
  results[0] = ForwardOne(list.forwards[0]);
  for (std::thread& t : others) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace pscluster
