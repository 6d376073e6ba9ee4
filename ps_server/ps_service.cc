#include "ps_server/ps_service.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

// A pull streamed as TensorChunks: each shard is encoded under its lock into a buffer (one
// copy), then written in chunks once the lock is released, so a slow client holds no shard.
class ChunkStreamSink : public DensePullSink {
 public:
  // `index`: the position of the (one) shard pulled in the client's request.
  ChunkStreamSink(grpc::ServerContext* ctx, grpc::ServerWriter<v1::TensorChunk>* writer,
                  v1::DataType wire, int64_t chunk_bytes, int index)
      : ctx_(ctx), writer_(writer), wire_(wire), chunk_bytes_(chunk_bytes), index_(index) {}

  absl::Status Begin(const std::vector<int64_t>&) override {
    absl::StatusOr<int> elem = WireBytesPerElement(wire_);
    if (!elem.ok()) return elem.status();
    elem_bytes_ = *elem;
    return absl::OkStatus();
  }

  absl::Status Values(int, const float* values, int64_t n) override {
    encoded_.resize(n * elem_bytes_);
    EncodeFloatsTo(values, n, wire_, encoded_.data());
    pending_ = true;
    return absl::OkStatus();
  }

  // Streams what the last Values() encoded. Called after it returned (no lock held).
  absl::Status Flush() {
    if (!pending_) return absl::OkStatus();
    pending_ = false;
    const int64_t total = static_cast<int64_t>(encoded_.size());
    const int64_t step = std::max<int64_t>(elem_bytes_, chunk_bytes_ / elem_bytes_ * elem_bytes_);
    int64_t offset = 0;
    do {
      const int64_t bytes = std::min(step, total - offset);
      chunk_.set_index(index_);
      chunk_.set_offset(offset / elem_bytes_);
      chunk_.mutable_data()->assign(encoded_.data() + offset, bytes);
      if (!writer_->Write(chunk_)) {
        return absl::CancelledError("the client went away during a pull");
      }
      offset += bytes;
    } while (offset < total);
    if (ctx_->IsCancelled()) return absl::CancelledError("pull cancelled");
    return absl::OkStatus();
  }

 private:
  grpc::ServerContext* const ctx_;
  grpc::ServerWriter<v1::TensorChunk>* const writer_;
  const v1::DataType wire_;
  const int64_t chunk_bytes_;
  int elem_bytes_ = 4;
  std::string encoded_;
  v1::TensorChunk chunk_;
  const int index_;
  bool pending_ = false;
};

// The keys of a sparse request: `packed_keys` (8-byte little-endian) or `keys`, not both.
absl::StatusOr<const int64_t*> RequestKeys(const google::protobuf::RepeatedField<int64_t>& keys,
                                           const std::string& packed, std::vector<int64_t>* copy,
                                           int64_t* n) {
  if (!packed.empty() && !keys.empty()) {
    return absl::InvalidArgumentError("a sparse request has both keys and packed_keys; send one");
  }
  if (packed.empty()) {
    *n = keys.size();
    return keys.data();
  }
  if (packed.size() % sizeof(int64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("packed_keys has ", packed.size(),
                                                   " bytes, not a whole number of 8-byte keys"));
  }
  *n = static_cast<int64_t>(packed.size() / sizeof(int64_t));
  if (reinterpret_cast<uintptr_t>(packed.data()) % alignof(int64_t) == 0) {
    return reinterpret_cast<const int64_t*>(packed.data());
  }
  copy->resize(*n);
  std::memcpy(copy->data(), packed.data(), packed.size());
  return copy->data();
}

// Feeds the chunks that follow a stream's header (PushDense, Replicate) into `push`, until the
// stream ends; INVALID_ARGUMENT for a second header, or AddChunk's refusal.
template <typename Request>
absl::Status ReadChunks(grpc::ServerReader<Request>* reader, const char* stream, DensePush* push) {
  Request msg;
  while (reader->Read(&msg)) {
    if (!msg.has_chunk()) {
      return absl::InvalidArgumentError(absl::StrCat("a ", stream, " stream has a second header"));
    }
    const v1::TensorChunk& c = msg.chunk();
    PS_RETURN_IF_ERROR(push->AddChunk(c.index(), c.offset(), c.data()));
  }
  return absl::OkStatus();
}

}  // namespace

PsService::PsService(ParameterStore* store, const PsServiceOptions& options)
    : store_(store), options_(options), backups_(store->options()), start_time_(absl::Now()) {
  backups_.SetPushCounter([store] { return store->total_pushes(); });
  // One memory budget for the task's own shards and the backups it holds.
  backups_.ShareBudget(store);
}

int PsService::SelfIndex() {
  absl::MutexLock lock(&mu_);
  return task_.job() == "ps" ? task_.index() : -1;
}

void PsService::SetIdentity(const v1::TaskId& task, const std::string& address, int data_port) {
  absl::MutexLock lock(&mu_);
  task_ = task;
  address_ = address;
  data_port_ = data_port;
}

grpc::Status PsService::CreateShards(grpc::ServerContext* ctx, const v1::CreateShardsRequest* req,
                                     v1::CreateShardsResponse* resp) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.CreateShards"));
  if (!req->ps_addresses().empty() && options_.ps_addresses_changed) {
    options_.ps_addresses_changed({req->ps_addresses().begin(), req->ps_addresses().end()});
  }
  if (req->replication() >= 2) backups_.SetReplicated();
  if (req->backups().empty()) return ToGrpcStatus(store_->CreateShards(*req, resp));
  // The backups' own checks first, so that a bad entry changes nothing; then the task's own
  // shards (which also check the chief's epoch), then the backups.
  const int self = SelfIndex();
  if (absl::Status s = BackupStores::Check(self, *req); !s.ok()) return ToGrpcStatus(s);
  v1::CreateShardsRequest own = *req;
  own.clear_backups();
  if (absl::Status s = store_->CreateShards(own, resp); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(backups_.Create(self, *req, resp));
}

grpc::Status PsService::PullDense(grpc::ServerContext* ctx, const v1::PullDenseRequest* req,
                                  grpc::ServerWriter<v1::TensorChunk>* writer) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.PullDense"));
  int64_t chunk_bytes = req->chunk_bytes() > 0 ? req->chunk_bytes() : options_.default_chunk_bytes;
  chunk_bytes = std::min(chunk_bytes, options_.max_chunk_bytes);
  if (absl::Status s = backups_.CheckLease(); !s.ok()) return ToGrpcStatus(s);
  // (Checked before the request is cut into one per shard.)
  if (absl::Status s = ParameterStore::CheckRangeCounts(*req); !s.ok()) return ToGrpcStatus(s);
  const bool ranged = req->element_begin_size() > 0;
  // One shard at a time: encoded under its lock by the store, streamed after.
  for (int i = 0; i < req->shards_size(); ++i) {
    v1::PullDenseRequest one = *req;
    one.clear_shards();
    *one.add_shards() = req->shards(i);
    if (ranged) {
      one.clear_element_begin();
      one.clear_element_end();
      one.add_element_begin(req->element_begin(i));
      one.add_element_end(req->element_end(i));
    }
    ChunkStreamSink sink(ctx, writer, WireOrFloat(req->wire_dtype()), chunk_bytes, i);
    ParameterStore* store = backups_.DenseStore(store_, one.shards());
    if (absl::Status s = backups_.CheckServes(store); !s.ok()) return ToGrpcStatus(s);
    absl::Status s = store->PullDense(one, &sink);
    if (s.ok()) s = sink.Flush();
    if (!s.ok()) return ToGrpcStatus(s);
  }
  return grpc::Status::OK;
}

grpc::Status PsService::PushDense(grpc::ServerContext* ctx,
                                  grpc::ServerReader<v1::PushDenseRequest>* reader,
                                  v1::PushDenseResponse* resp) {
  v1::PushDenseRequest msg;
  const bool has_header = reader->Read(&msg) && msg.has_header();
  // The push counts for the worker its header names: the caller's own task only.
  const v1::TaskId pusher = WorkerTask(msg.header().worker());
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.PushDense", &pusher));
  if (!has_header) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a PushDense stream must start with a header");
  }
  if (absl::Status s = backups_.CheckLease(); !s.ok()) return ToGrpcStatus(s);
  std::unique_ptr<DensePush> push = pushes_.Take();
  ParameterStore* store = backups_.DenseStore(store_, msg.header().shards());
  absl::Status s = backups_.CheckServes(store);
  if (s.ok()) s = store->StartPushDense(msg.header(), push.get());
  if (s.ok()) s = ReadChunks(reader, "PushDense", push.get());
  if (s.ok()) s = store->FinishPushDense(push.get(), resp);
  pushes_.Return(std::move(push));
  return ToGrpcStatus(s);
}

grpc::Status PsService::Replicate(grpc::ServerContext* ctx,
                                  grpc::ServerReader<v1::ReplicateRequest>* reader,
                                  v1::ReplicateResponse* resp) {
  v1::ReplicateRequest msg;
  const bool has_header = reader->Read(&msg) && msg.has_header();
  // A primary forwards its own updates only.
  v1::TaskId primary;
  primary.set_job("ps");
  primary.set_index(msg.header().primary_ps_task());
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.Replicate", &primary));
  if (!has_header) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a Replicate stream must start with a header");
  }
  const v1::ReplicateHeader header = msg.header();
  absl::StatusOr<ParameterStore*> store = backups_.ForForward(header.primary_ps_task());
  if (!store.ok()) return ToGrpcStatus(store.status());
  std::unique_ptr<DensePush> push = pushes_.Take();
  absl::Status s = (*store)->StartPushDense(header.push(), push.get(), /*forwarded=*/true);
  if (s.ok()) s = ReadChunks(reader, "Replicate", push.get());
  if (s.ok()) s = (*store)->ApplyReplicatedDense(header, push.get(), resp);
  pushes_.Return(std::move(push));
  return ToGrpcStatus(s);
}

grpc::Status PsService::ReplicateSparse(grpc::ServerContext* ctx,
                                        const v1::ReplicateSparseRequest* req,
                                        v1::ReplicateSparseResponse* resp) {
  // A primary forwards its own updates only.
  v1::TaskId primary;
  primary.set_job("ps");
  primary.set_index(req->primary_ps_task());
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.ReplicateSparse", &primary));
  absl::StatusOr<ParameterStore*> store = backups_.ForForward(req->primary_ps_task());
  if (!store.ok()) return ToGrpcStatus(store.status());
  return ToGrpcStatus((*store)->ApplyReplicatedSparse(*req, resp));
}

grpc::Status PsService::FailOverPs(grpc::ServerContext* ctx, const v1::FailOverPsRequest* req,
                                   v1::FailOverPsResponse* resp) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.FailOverPs"));
  if (absl::Status s = store_->CheckChiefEpoch(req->chief_epoch(), "FailOverPs"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  const int failed = req->failed_ps_task();
  if (failed < 0 || failed == SelfIndex()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("FailOverPs names ps:", failed,
                                     "; expected another ps task's index (the one that died)"));
  }
  if (const int held = backups_.DenseShardsOf(failed); held < req->min_dense_shards()) {
    // (Before any promotion: a task that came back empty must not take the failed task's
    // place, nor refuse its forwards after a failover the chief does not publish.)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("FailOverPs of ps:", failed, ": this task backs up ", held,
                                     " of its dense shards; the placement puts ",
                                     req->min_dense_shards(), " here"));
  }
  int promoted = 0;
  bool already = false;
  backups_.Promote(failed, &promoted, &already);
  const int unreplicated = store_->DropBackup(failed);
  resp->set_dense_promoted(promoted);
  resp->set_dense_unreplicated(unreplicated);
  resp->set_already(already);
  if (!already) {
    LOG(WARNING) << "ps:" << failed << " failed over: serving the " << promoted
                 << " dense shards this task backs up of it as their primary (its forwards are "
                    "refused); "
                 << unreplicated << " of this task's own shards it backed up are not forwarded "
                 << "any more";
  }
  return grpc::Status::OK;
}

grpc::Status PsService::RebuildBackup(grpc::ServerContext* ctx, const v1::RebuildBackupRequest* req,
                                      v1::RebuildBackupResponse* resp) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.RebuildBackup"));
  if (absl::Status s = store_->CheckChiefEpoch(req->chief_epoch(), "RebuildBackup"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (!req->ps_addresses().empty() && options_.ps_addresses_changed) {
    options_.ps_addresses_changed({req->ps_addresses().begin(), req->ps_addresses().end()});
  }
  const absl::Time start = absl::Now();
  absl::Status s =
      store_->RebuildBackup(*req, SelfIndex(), resp, [ctx] { return ctx->IsCancelled(); });
  if (s.ok()) {
    LOG(INFO) << "rebuilt the backup of " << resp->shards_copied() << " dense shards and "
              << resp->tables_copied() << " tables (" << resp->rows_copied()
              << " rows) on ps:" << req->backup_ps_task() << " (" << resp->bytes_copied()
              << " bytes copied in " << absl::FormatDuration(absl::Now() - start)
              << ", pushes going on)";
  }
  return ToGrpcStatus(s);
}

grpc::Status PsService::InstallReplica(grpc::ServerContext* ctx,
                                       grpc::ServerReader<v1::InstallReplicaRequest>* reader,
                                       v1::InstallReplicaResponse* resp) {
  v1::InstallReplicaRequest msg;
  const bool has_first = reader->Read(&msg);
  // A primary sends copies of its own shards only.
  v1::TaskId primary;
  primary.set_job("ps");
  primary.set_index(msg.primary_ps_task());
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.InstallReplica", &primary));
  if (!has_first || (msg.has_replica() == msg.has_table_replica()) || msg.total_bytes() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "an InstallReplica stream must start with the copy's shard, update "
                        "count and total_bytes >= 0, or with a table stripe's copy");
  }
  absl::StatusOr<ParameterStore*> store = backups_.ForForward(msg.primary_ps_task());
  if (!store.ok()) return ToGrpcStatus(store.status());
  if (msg.has_table_replica()) return InstallTableReplica(*store, msg, reader, resp);
  v1::DenseReplica replica = std::move(*msg.mutable_replica());
  const int64_t total = msg.total_bytes();
  // The size is the shard's, checked before anything is buffered.
  absl::StatusOr<int64_t> expected = (*store)->ReplicaBytes(replica.shard());
  if (!expected.ok()) return ToGrpcStatus(expected.status());
  if (total != *expected) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("a copy of ", replica.shard().variable(), "/", replica.shard().partition(),
                     " of ", total, " bytes; its backup here holds ", *expected,
                     " bytes of values and slots"));
  }
  std::string* bytes = replica.mutable_values_and_slots();
  bytes->clear();
  bytes->reserve(static_cast<size_t>(total));
  while (reader->Read(&msg)) {
    if (static_cast<int64_t>(bytes->size() + msg.data().size()) > total) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("an InstallReplica stream carries more than its ", total,
                                       " bytes; expected exactly total_bytes"));
    }
    bytes->append(msg.data());
  }
  if (static_cast<int64_t>(bytes->size()) != total) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("an InstallReplica stream carries ", bytes->size(),
                                     " bytes of its ", total, "; expected exactly total_bytes"));
  }
  bool installed = false;
  absl::Status s = (*store)->InstallReplica(replica, &installed);
  resp->set_installed(installed);
  return ToGrpcStatus(s);
}

grpc::Status PsService::InstallTableReplica(ParameterStore* store,
                                            const v1::InstallReplicaRequest& first,
                                            grpc::ServerReader<v1::InstallReplicaRequest>* reader,
                                            v1::InstallReplicaResponse* resp) {
  const v1::TableReplica& replica = first.table_replica();
  int64_t stride = 0;
  if (replica.stripe() >= 0) {
    absl::StatusOr<int64_t> s = store->TableReplicaStride(replica.table());
    if (!s.ok()) return ToGrpcStatus(s.status());
    stride = *s;
  }
  // The size is the rows', checked before anything is buffered.
  const int64_t rows = replica.rows();
  const int64_t row_bytes =
      2 * static_cast<int64_t>(sizeof(int64_t)) + stride * static_cast<int64_t>(sizeof(float));
  if (rows < 0 || rows > (int64_t{1} << 40) / row_bytes ||
      first.total_bytes() != rows * row_bytes || (replica.stripe() < 0 && rows != 0)) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("a copy of table ", replica.table(), "'s stripe ", replica.stripe(), " of ",
                     rows, " rows in ", first.total_bytes(), " bytes; expected ", row_bytes,
                     " bytes per row (key, count, ", stride,
                     " floats), and no rows with the ledger (stripe -1)"));
  }
  const int64_t total = first.total_bytes();
  std::string bytes;
  // (Room for what is announced only up to 64 MiB: more grows as it comes, so that a size
  // announced but never sent costs nothing.)
  bytes.reserve(static_cast<size_t>(std::min<int64_t>(total, int64_t{64} << 20)));
  v1::InstallReplicaRequest msg;
  while (reader->Read(&msg)) {
    if (static_cast<int64_t>(bytes.size() + msg.data().size()) > total) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("an InstallReplica stream carries more than its ", total,
                                       " bytes; expected exactly total_bytes"));
    }
    bytes.append(msg.data());
  }
  if (static_cast<int64_t>(bytes.size()) != total) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("an InstallReplica stream carries ", bytes.size(),
                                     " bytes of its ", total, "; expected exactly total_bytes"));
  }
  // (A std::string's storage is malloc's, aligned for any scalar, once past its inline buffer;
  // the parts are copied out where it is not.)
  std::vector<int64_t> keys(rows), counts(rows);
  std::vector<float> values(rows * stride);
  if (rows > 0) {
    std::memcpy(keys.data(), bytes.data(), rows * sizeof(int64_t));
    std::memcpy(counts.data(), bytes.data() + rows * sizeof(int64_t), rows * sizeof(int64_t));
    std::memcpy(values.data(), bytes.data() + 2 * rows * sizeof(int64_t),
                values.size() * sizeof(float));
  }
  bool installed = false;
  absl::Status s =
      store->InstallTableReplica(replica, keys.data(), counts.data(), values.data(), &installed);
  resp->set_installed(installed);
  return ToGrpcStatus(s);
}

grpc::Status PsService::PullSparse(grpc::ServerContext* ctx, const v1::PullSparseRequest* req,
                                   v1::PullSparseResponse* resp) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.PullSparse"));
  if (absl::Status s = backups_.CheckLease(); !s.ok()) return ToGrpcStatus(s);
  std::vector<int64_t> key_copy;
  int64_t n = 0;
  absl::StatusOr<const int64_t*> keys = RequestKeys(req->keys(), req->packed_keys(), &key_copy, &n);
  if (!keys.ok()) return ToGrpcStatus(keys.status());
  std::vector<float> rows;
  ParameterStore* store = backups_.SparseStore(store_, req->table(), *keys, n);
  if (absl::Status s = backups_.CheckServes(store); !s.ok()) return ToGrpcStatus(s);
  if (absl::Status s = store->PullSparse(*req, *keys, n, &rows); !s.ok()) return ToGrpcStatus(s);
  const v1::DataType wire = WireOrFloat(req->wire_dtype());
  // The store already checked the dtype.
  const int elem_bytes = WireBytesPerElement(wire).value_or(4);
  std::string* out = resp->mutable_values();
  out->resize(rows.size() * elem_bytes);
  EncodeFloatsTo(rows.data(), static_cast<int64_t>(rows.size()), wire, out->data());
  return grpc::Status::OK;
}

grpc::Status PsService::PushSparse(grpc::ServerContext* ctx, const v1::PushSparseRequest* req,
                                   v1::PushSparseResponse* resp) {
  const v1::TaskId pusher = WorkerTask(req->worker());
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.PushSparse", &pusher));
  if (absl::Status s = backups_.CheckLease(); !s.ok()) return ToGrpcStatus(s);
  std::vector<int64_t> key_copy;
  int64_t n = 0;
  absl::StatusOr<const int64_t*> keys = RequestKeys(req->keys(), req->packed_keys(), &key_copy, &n);
  if (!keys.ok()) return ToGrpcStatus(keys.status());
  ParameterStore* store = backups_.SparseStore(store_, req->table(), *keys, n);
  if (absl::Status s = backups_.CheckServes(store); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(store->PushSparse(*req, *keys, n, req->gradients(), resp));
}

grpc::Status PsService::ListShards(grpc::ServerContext* ctx, const v1::ListShardsRequest* req,
                                   v1::ListShardsResponse* resp) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.ListShards"));
  *resp = store_->ListShards();
  if (req->include_backups()) backups_.AppendShards(resp);
  return grpc::Status::OK;
}

grpc::Status PsService::InspectShard(grpc::ServerContext* ctx, const v1::InspectShardRequest* req,
                                     v1::InspectShardResponse* resp) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.InspectShard"));
  absl::StatusOr<v1::InspectShardResponse> r =
      req->backup() ? backups_.Inspect(*req) : store_->Inspect(*req);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status PsService::SaveShards(grpc::ServerContext* ctx, const v1::SaveShardsRequest* req,
                                   v1::SaveShardsResponse* resp) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.SaveShards"));
  // With the shards this task took over in failovers: a checkpoint after one is whole.
  return ToGrpcStatus(store_->Save(*req, resp, backups_.Promoted()));
}

grpc::Status PsService::RestoreShards(grpc::ServerContext* ctx, const v1::RestoreShardsRequest* req,
                                      v1::RestoreShardsResponse* resp) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.RestoreShards"));
  if (absl::Status s = store_->Restore(*req, resp); !s.ok()) return ToGrpcStatus(s);
  // The backups (and shards taken over) go back to the same checkpoint as their primaries.
  return ToGrpcStatus(backups_.Restore(*req));
}

grpc::Status PsService::GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest*,
                                  v1::TaskStatus* resp) {
  PS_RETURN_IF_DENIED(options_.authorizer.Check(*ctx, "ParameterServer.GetStatus"));
  {
    absl::MutexLock lock(&mu_);
    *resp->mutable_task() = task_;
    resp->set_address(address_);
    resp->set_data_port(data_port_);
  }
  resp->set_serves_pull_ranges(true);
  resp->set_health(v1::HEALTH_SERVING);
  resp->set_start_unix_micros(absl::ToUnixMicros(start_time_));
  resp->set_uptime_micros(absl::ToInt64Microseconds(absl::Now() - start_time_));
  resp->set_detail(
      absl::StrCat(store_->total_pushes(), " pushes, ", store_->total_pulls(), " pulls"));
  return grpc::Status::OK;
}

}  // namespace pscluster
