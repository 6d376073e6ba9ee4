#include "ps_server/ps_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/wire_codec.h"

namespace pscluster {
namespace {

v1::DataType WireOrFloat(v1::DataType t) { return t == v1::DT_INVALID ? v1::DT_FLOAT32 : t; }

}  // namespace

PsService::PsService(ParameterStore* store, const PsServiceOptions& options)
    : store_(store), options_(options), start_time_(absl::Now()) {}

void PsService::SetIdentity(const v1::TaskId& task, const std::string& address) {
  absl::MutexLock lock(&mu_);
  task_ = task;
  address_ = address;
}

grpc::Status PsService::CreateShards(grpc::ServerContext*, const v1::CreateShardsRequest* req,
                                     v1::CreateShardsResponse* resp) {
  return ToGrpcStatus(store_->CreateShards(*req, resp));
}

grpc::Status PsService::PullDense(grpc::ServerContext* ctx, const v1::PullDenseRequest* req,
                                  grpc::ServerWriter<v1::TensorChunk>* writer) {
  absl::StatusOr<std::vector<std::shared_ptr<DenseShard>>> shards =
      store_->FindDense(req->shards());
  if (!shards.ok()) return ToGrpcStatus(shards.status());
  store_->SettleDense(*shards, req->has_step() ? req->step() : -1);
  const v1::DataType wire = WireOrFloat(req->wire_dtype());
  absl::StatusOr<int> elem_bytes = WireBytesPerElement(wire);
  if (!elem_bytes.ok()) return ToGrpcStatus(elem_bytes.status());
  int64_t chunk_bytes = req->chunk_bytes() > 0 ? req->chunk_bytes() : options_.default_chunk_bytes;
  chunk_bytes = std::min(chunk_bytes, options_.max_chunk_bytes);
  const int64_t chunk_elems = std::max<int64_t>(1, chunk_bytes / *elem_bytes);

  std::vector<float> values;
  v1::TensorChunk chunk;
  for (size_t i = 0; i < shards->size(); ++i) {
    const DenseShard& shard = *(*shards)[i];
    // A consistent snapshot of the whole shard, taken under its lock, then streamed.
    values.resize(shard.num_elements());
    shard.ReadValues(values.data());
    const int64_t n = shard.num_elements();
    int64_t offset = 0;
    do {
      const int64_t count = std::min(chunk_elems, n - offset);
      chunk.set_index(static_cast<int32_t>(i));
      chunk.set_offset(offset);
      std::string* data = chunk.mutable_data();
      data->resize(count * *elem_bytes);
      EncodeFloatsTo(values.data() + offset, count, wire, data->data());
      if (!writer->Write(chunk)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away during a pull");
      }
      offset += count;
    } while (offset < n);
    shard.counters().pulls.fetch_add(1, std::memory_order_relaxed);
    shard.counters().bytes_out.fetch_add(n * *elem_bytes, std::memory_order_relaxed);
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "pull cancelled");
  }
  return grpc::Status::OK;
}

grpc::Status PsService::PushDense(grpc::ServerContext*,
                                  grpc::ServerReader<v1::PushDenseRequest>* reader,
                                  v1::PushDenseResponse* resp) {
  v1::PushDenseRequest msg;
  if (!reader->Read(&msg) || !msg.has_header()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a PushDense stream must start with a header");
  }
  const v1::PushDenseHeader header = msg.header();
  absl::StatusOr<std::vector<std::shared_ptr<DenseShard>>> shards =
      store_->FindDense(header.shards());
  if (!shards.ok()) return ToGrpcStatus(shards.status());
  if (header.num_elements_size() != header.shards_size()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("the push header names ", header.shards_size(), " shards but gives ",
                     header.num_elements_size(), " element counts"));
  }
  const v1::DataType wire = WireOrFloat(header.wire_dtype());
  absl::StatusOr<int> elem_bytes = WireBytesPerElement(wire);
  if (!elem_bytes.ok()) return ToGrpcStatus(elem_bytes.status());
  std::vector<std::vector<float>> grads(shards->size());
  std::vector<int64_t> received(shards->size(), 0);
  for (size_t i = 0; i < shards->size(); ++i) {
    const DenseShard& s = *(*shards)[i];
    if (header.num_elements(i) != s.num_elements()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("variable ", s.name(), "/", s.partition(), ": gradient has ",
                                       header.num_elements(i), " elements, expected ",
                                       s.num_elements(), " (shape ", ShapeString(s.shape()), ")"));
    }
    grads[i].resize(s.num_elements());
  }
  int64_t wire_bytes = 0;
  while (reader->Read(&msg)) {
    if (!msg.has_chunk()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a PushDense stream has a second header");
    }
    const v1::TensorChunk& c = msg.chunk();
    if (c.index() < 0 || c.index() >= static_cast<int>(grads.size())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("chunk for shard index ", c.index(), " of a push naming ",
                                       grads.size(), " shards"));
    }
    std::vector<float>& g = grads[c.index()];
    const int64_t count = static_cast<int64_t>(c.data().size()) / *elem_bytes;
    if (c.offset() < 0 || c.offset() + count > static_cast<int64_t>(g.size()) ||
        c.data().size() % *elem_bytes != 0) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("chunk [", c.offset(), ", +", c.data().size(),
                       " bytes) does not fit variable ", header.shards(c.index()).variable(),
                       " of ", g.size(), " elements"));
    }
    absl::Status decoded = DecodeFloats(c.data(), wire, g.data() + c.offset(), count);
    if (!decoded.ok()) return ToGrpcStatus(decoded);
    received[c.index()] += count;
    wire_bytes += c.data().size();
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (received[i] != static_cast<int64_t>(grads[i].size())) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("variable ", header.shards(i).variable(), "/", header.shards(i).partition(),
                       ": received ", received[i], " of ", grads[i].size(), " gradient elements"));
    }
  }
  return ToGrpcStatus(
      store_->PushDense(*shards, grads, wire_bytes, header.step(), header.worker(), resp));
}

grpc::Status PsService::PullSparse(grpc::ServerContext*, const v1::PullSparseRequest* req,
                                   v1::PullSparseResponse* resp) {
  absl::StatusOr<ParameterStore::Table> t = store_->FindTable(req->table());
  if (!t.ok()) return ToGrpcStatus(t.status());
  const v1::DataType wire = WireOrFloat(req->wire_dtype());
  absl::StatusOr<int> elem_bytes = WireBytesPerElement(wire);
  if (!elem_bytes.ok()) return ToGrpcStatus(elem_bytes.status());
  const int64_t n = req->keys_size();
  const int64_t dim = t->table->dim();
  std::string* out = resp->mutable_values();
  if (wire == v1::DT_FLOAT32) {
    out->resize(n * dim * sizeof(float));
    PS_RETURN_IF_ERROR_GRPC(store_->PullSparse(req->table(), req->keys().data(), n,
                                               reinterpret_cast<float*>(out->data()), out->size(),
                                               req->has_step() ? req->step() : -1));
  } else {
    std::vector<float> rows(n * dim);
    PS_RETURN_IF_ERROR_GRPC(store_->PullSparse(req->table(), req->keys().data(), n, rows.data(),
                                               n * dim * *elem_bytes,
                                               req->has_step() ? req->step() : -1));
    out->resize(n * dim * *elem_bytes);
    EncodeFloatsTo(rows.data(), n * dim, wire, out->data());
  }
  return grpc::Status::OK;
}

grpc::Status PsService::PushSparse(grpc::ServerContext*, const v1::PushSparseRequest* req,
                                   v1::PushSparseResponse* resp) {
  absl::StatusOr<ParameterStore::Table> t = store_->FindTable(req->table());
  if (!t.ok()) return ToGrpcStatus(t.status());
  const v1::DataType wire = WireOrFloat(req->wire_dtype());
  absl::StatusOr<int> elem_bytes = WireBytesPerElement(wire);
  if (!elem_bytes.ok()) return ToGrpcStatus(elem_bytes.status());
  const int64_t n = req->keys_size();
  const int64_t dim = t->table->dim();
  if (static_cast<int64_t>(req->gradients().size()) != n * dim * *elem_bytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("table ", req->table(), ": ", n, " keys of dim ", dim,
                                     " need ", n * dim * *elem_bytes, " gradient bytes of ",
                                     v1::DataType_Name(wire), ", got ", req->gradients().size()));
  }
  std::vector<float> grads(n * dim);
  PS_RETURN_IF_ERROR_GRPC(DecodeFloats(req->gradients(), wire, grads.data(), n * dim));
  return ToGrpcStatus(store_->PushSparse(req->table(), req->keys().data(), n, grads.data(),
                                         req->gradients().size(), req->step(), req->worker(),
                                         resp));
}

grpc::Status PsService::ListShards(grpc::ServerContext*, const v1::ListShardsRequest*,
                                   v1::ListShardsResponse* resp) {
  *resp = store_->ListShards();
  return grpc::Status::OK;
}

grpc::Status PsService::InspectShard(grpc::ServerContext*, const v1::InspectShardRequest* req,
                                     v1::InspectShardResponse* resp) {
  store_->SettleAll();  // an operator sees every complete step
  absl::StatusOr<v1::InspectShardResponse> r = store_->Inspect(*req);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status PsService::SaveShards(grpc::ServerContext*, const v1::SaveShardsRequest* req,
                                   v1::SaveShardsResponse* resp) {
  return ToGrpcStatus(store_->Save(*req, resp));
}

grpc::Status PsService::RestoreShards(grpc::ServerContext*, const v1::RestoreShardsRequest* req,
                                      v1::RestoreShardsResponse* resp) {
  return ToGrpcStatus(store_->Restore(*req, resp));
}

grpc::Status PsService::GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                                  v1::TaskStatus* resp) {
  {
    absl::MutexLock lock(&mu_);
    *resp->mutable_task() = task_;
    resp->set_address(address_);
  }
  resp->set_health(v1::HEALTH_SERVING);
  resp->set_start_unix_micros(absl::ToUnixMicros(start_time_));
  resp->set_uptime_micros(absl::ToInt64Microseconds(absl::Now() - start_time_));
  resp->set_detail(
      absl::StrCat(store_->total_pushes(), " pushes, ", store_->total_pulls(), " pulls"));
  return grpc::Status::OK;
}

}  // namespace pscluster
