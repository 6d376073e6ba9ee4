#include "client/grpc_ps_transport.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "client/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace pscluster {

GrpcPsTransport::GrpcPsTransport(const std::vector<std::string>& ps_addresses,
                                 const GrpcPsTransportOptions& options)
    : options_(options),
      num_ps_(static_cast<int>(ps_addresses.size())),
      calls_(new CallSet[ps_addresses.size()]) {
  absl::MutexLock lock(&mu_);
  for (const std::string& address : ps_addresses) {
    targets_.push_back(Target{address, NewStub(address)});
  }
}

GrpcPsTransport::GrpcPsTransport(
    std::vector<std::unique_ptr<v1::ParameterServer::StubInterface>> stubs,
    const GrpcPsTransportOptions& options)
    : options_(options),
      num_ps_(static_cast<int>(stubs.size())),
      calls_(new CallSet[stubs.size()]) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < stubs.size(); ++i) {
    targets_.push_back(Target{absl::StrCat("stub ", i), std::move(stubs[i])});
  }
}

std::shared_ptr<v1::ParameterServer::StubInterface> GrpcPsTransport::NewStub(
    const std::string& address) const {
  GrpcChannelOptions channel;
  channel.tls = options_.tls;
  channel.max_message_bytes = options_.max_message_bytes;
  // A ps task that restarts comes back at the same address within seconds.
  channel.fast_reconnect = true;
  return v1::ParameterServer::NewStub(NewGrpcChannel(address, channel));
}

std::shared_ptr<v1::ParameterServer::StubInterface> GrpcPsTransport::Stub(int ps) const {
  absl::MutexLock lock(&mu_);
  return targets_[ps].stub;
}

std::string GrpcPsTransport::address(int ps) const {
  absl::MutexLock lock(&mu_);
  return targets_[ps].address;
}

absl::Status GrpcPsTransport::SetAddress(int ps, const std::string& address) {
  if (ps < 0 || ps >= num_ps_) {
    return absl::InvalidArgumentError(absl::StrCat("no ps task ", ps, " (", num_ps_, " tasks)"));
  }
  std::shared_ptr<v1::ParameterServer::StubInterface> stub = NewStub(address);
  absl::MutexLock lock(&mu_);
  if (targets_[ps].address != address) targets_[ps] = Target{address, std::move(stub)};
  return absl::OkStatus();
}

GrpcPsTransport::TrackedContext::TrackedContext(const GrpcPsTransport* transport, int ps)
    : transport_(transport), ps_(ps) {
  CallSet& calls = transport_->calls_[ps_];
  absl::MutexLock lock(&calls.mu);
  calls.live.insert(&ctx_);
}

GrpcPsTransport::TrackedContext::~TrackedContext() {
  CallSet& calls = transport_->calls_[ps_];
  absl::MutexLock lock(&calls.mu);
  calls.live.erase(&ctx_);
}

void GrpcPsTransport::AbortCalls(int ps) {
  CallSet& calls = calls_[ps];
  absl::MutexLock lock(&calls.mu);
  for (grpc::ClientContext* ctx : calls.live) ctx->TryCancel();
}

void GrpcPsTransport::SetDeadline(grpc::ClientContext* ctx) const {
  SetDeadline(ctx, options_.rpc_timeout);
}

void GrpcPsTransport::SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
}

absl::Status GrpcPsTransport::Annotate(int ps, const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::CANCELLED) {
    // Ended by AbortCalls (the task was failed over): retried, and planned again.
    return absl::UnavailableError(absl::StrCat("ps:", ps, " (", address(ps),
                                               "): the call was ended: ", status.error_message()));
  }
  absl::Status s = FromGrpcStatus(status);
  return absl::Status(s.code(), absl::StrCat("ps:", ps, " (", address(ps), "): ", s.message()));
}

absl::Status GrpcPsTransport::CreateShards(int ps, const v1::CreateShardsRequest& request,
                                           v1::CreateShardsResponse* response) {
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx);
  return Annotate(ps, Stub(ps)->CreateShards(&ctx, request, response));
}

absl::Status GrpcPsTransport::PullDense(int ps, const std::vector<DenseSlice>& slices,
                                        v1::DataType wire_dtype, int64_t step) {
  const v1::DataType wire = WireOrFloat(wire_dtype);
  PS_ASSIGN_OR_RETURN(int elem_bytes, WireBytesPerElement(wire));
  v1::PullDenseRequest req;
  for (const DenseSlice& s : slices) *req.add_shards() = s.ref;
  req.set_wire_dtype(wire);
  if (step >= 0) req.set_step(step);
  req.set_chunk_bytes(options_.chunk_bytes);
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx);
  // The stub (and its channel) lives as long as the stream, even if SetAddress replaces it.
  const std::shared_ptr<v1::ParameterServer::StubInterface> stub = Stub(ps);
  std::unique_ptr<grpc::ClientReaderInterface<v1::TensorChunk>> reader = stub->PullDense(&ctx, req);
  std::vector<int64_t> received(slices.size(), 0);
  v1::TensorChunk chunk;
  absl::Status bad;
  while (reader->Read(&chunk)) {
    if (!bad.ok()) continue;  // drain, then report
    const int64_t count = static_cast<int64_t>(chunk.data().size()) / elem_bytes;
    if (chunk.index() < 0 || chunk.index() >= static_cast<int>(slices.size()) ||
        chunk.offset() < 0 || chunk.offset() + count > slices[chunk.index()].num_elements) {
      bad = absl::DataLossError(absl::StrCat("ps:", ps, " sent chunk ", chunk.index(), "@",
                                             chunk.offset(), " outside the pulled shards"));
      ctx.TryCancel();
      continue;
    }
    const DenseSlice& s = slices[chunk.index()];
    bad = DecodeFloats(chunk.data(), wire, s.pull_into + chunk.offset(), count);
    received[chunk.index()] += count;
  }
  absl::Status finished = Annotate(ps, reader->Finish());
  PS_RETURN_IF_ERROR(bad);
  PS_RETURN_IF_ERROR(finished);
  for (size_t i = 0; i < slices.size(); ++i) {
    if (received[i] != slices[i].num_elements) {
      return absl::DataLossError(
          absl::StrCat("ps:", ps, " sent ", received[i], " of ", slices[i].num_elements,
                       " elements of ", slices[i].ref.variable(), "/", slices[i].ref.partition(),
                       " (is the caller's placement out of date?)"));
    }
  }
  return absl::OkStatus();
}

absl::Status GrpcPsTransport::PushDense(int ps, const std::vector<DenseSlice>& slices,
                                        const PushMeta& meta, v1::PushDenseResponse* response) {
  const v1::DataType wire = WireOrFloat(meta.wire_dtype);
  PS_ASSIGN_OR_RETURN(int elem_bytes, WireBytesPerElement(wire));
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx);
  const std::shared_ptr<v1::ParameterServer::StubInterface> stub = Stub(ps);
  std::unique_ptr<grpc::ClientWriterInterface<v1::PushDenseRequest>> writer =
      stub->PushDense(&ctx, response);
  v1::PushDenseRequest msg;
  v1::PushDenseHeader* header = msg.mutable_header();
  for (const DenseSlice& s : slices) {
    *header->add_shards() = s.ref;
    header->add_num_elements(s.num_elements);
  }
  header->set_wire_dtype(wire);
  header->set_step(meta.step);
  header->set_worker(meta.worker);
  header->set_delta(meta.delta);
  *header->mutable_request_id() = meta.request_id;
  bool open = writer->Write(msg);
  const int64_t chunk_elems = std::max<int64_t>(1, options_.chunk_bytes / elem_bytes);
  v1::PushDenseRequest chunk_msg;
  v1::TensorChunk* chunk = chunk_msg.mutable_chunk();
  for (size_t i = 0; i < slices.size() && open; ++i) {
    const DenseSlice& s = slices[i];
    for (int64_t offset = 0; offset < s.num_elements && open; offset += chunk_elems) {
      const int64_t count = std::min(chunk_elems, s.num_elements - offset);
      chunk->set_index(static_cast<int32_t>(i));
      chunk->set_offset(offset);
      std::string* data = chunk->mutable_data();
      data->resize(count * elem_bytes);
      EncodeFloatsTo(s.push_from + offset, count, wire, data->data());
      // A false Write means the server has already answered (an error): stop and read it.
      open = writer->Write(chunk_msg);
    }
  }
  if (open) writer->WritesDone();
  return Annotate(ps, writer->Finish());
}

absl::Status GrpcPsTransport::PullSparse(int ps, const std::string& table, const int64_t* keys,
                                         int64_t n, int64_t dim, v1::DataType wire_dtype,
                                         int64_t step, float* out) {
  const v1::DataType wire = WireOrFloat(wire_dtype);
  v1::PullSparseRequest req;
  req.set_table(table);
  req.set_packed_keys(reinterpret_cast<const char*>(keys), n * sizeof(int64_t));
  req.set_wire_dtype(wire);
  if (step >= 0) req.set_step(step);
  v1::PullSparseResponse resp;
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx);
  PS_RETURN_IF_ERROR(Annotate(ps, Stub(ps)->PullSparse(&ctx, req, &resp)));
  absl::Status decoded = DecodeFloats(resp.values(), wire, out, n * dim);
  if (!decoded.ok()) {
    return absl::DataLossError(absl::StrCat("ps:", ps, " answered a pull of ", n, " rows of ",
                                            table, ": ", decoded.message()));
  }
  return absl::OkStatus();
}

absl::Status GrpcPsTransport::PushSparse(int ps, const std::string& table, const int64_t* keys,
                                         int64_t n, int64_t dim, const float* grads,
                                         const PushMeta& meta, v1::PushSparseResponse* response) {
  const v1::DataType wire = WireOrFloat(meta.wire_dtype);
  v1::PushSparseRequest req;
  req.set_table(table);
  req.set_packed_keys(reinterpret_cast<const char*>(keys), n * sizeof(int64_t));
  PS_RETURN_IF_ERROR(EncodeFloats(grads, n * dim, wire, req.mutable_gradients()));
  req.set_wire_dtype(wire);
  req.set_step(meta.step);
  req.set_worker(meta.worker);
  *req.mutable_request_id() = meta.request_id;
  req.set_part(meta.part);
  req.set_num_parts(meta.num_parts);
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx);
  return Annotate(ps, Stub(ps)->PushSparse(&ctx, req, response));
}

absl::StatusOr<v1::ListShardsResponse> GrpcPsTransport::ListShards(
    int ps, const v1::ListShardsRequest& request) {
  v1::ListShardsResponse resp;
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx);
  PS_RETURN_IF_ERROR(Annotate(ps, Stub(ps)->ListShards(&ctx, request, &resp)));
  return resp;
}

absl::StatusOr<v1::InspectShardResponse> GrpcPsTransport::InspectShard(
    int ps, const v1::InspectShardRequest& request) {
  v1::InspectShardResponse resp;
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx);
  PS_RETURN_IF_ERROR(Annotate(ps, Stub(ps)->InspectShard(&ctx, request, &resp)));
  return resp;
}

absl::Status GrpcPsTransport::SaveShards(int ps, const v1::SaveShardsRequest& request,
                                         v1::SaveShardsResponse* response) {
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx, options_.checkpoint_timeout);
  return Annotate(ps, Stub(ps)->SaveShards(&ctx, request, response));
}

absl::Status GrpcPsTransport::RestoreShards(int ps, const v1::RestoreShardsRequest& request,
                                            v1::RestoreShardsResponse* response) {
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx, options_.checkpoint_timeout);
  return Annotate(ps, Stub(ps)->RestoreShards(&ctx, request, response));
}

absl::Status GrpcPsTransport::FailOverPs(int ps, const v1::FailOverPsRequest& request,
                                         v1::FailOverPsResponse* response) {
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx);
  return Annotate(ps, Stub(ps)->FailOverPs(&ctx, request, response));
}

absl::Status GrpcPsTransport::RebuildBackup(int ps, const v1::RebuildBackupRequest& request,
                                            v1::RebuildBackupResponse* response) {
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx, options_.checkpoint_timeout);  // copies as large as a checkpoint's parts
  return Annotate(ps, Stub(ps)->RebuildBackup(&ctx, request, response));
}

absl::StatusOr<v1::TaskStatus> GrpcPsTransport::GetStatus(int ps) {
  v1::TaskStatus resp;
  TrackedContext call(this, ps);
  grpc::ClientContext& ctx = *call.get();
  SetDeadline(&ctx);
  PS_RETURN_IF_ERROR(Annotate(ps, Stub(ps)->GetStatus(&ctx, v1::GetStatusRequest(), &resp)));
  return resp;
}

}  // namespace pscluster
