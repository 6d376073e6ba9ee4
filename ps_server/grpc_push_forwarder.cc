#include "ps_server/grpc_push_forwarder.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace pscluster {

GrpcPushForwarder::GrpcPushForwarder(int self, GrpcChannelOptions channel, absl::Duration timeout)
    : self_(self), channel_(std::move(channel)), timeout_(timeout) {}

void GrpcPushForwarder::SetAddresses(const std::vector<std::string>& addresses) {
  absl::MutexLock lock(&mu_);
  addresses_ = addresses;
}

std::shared_ptr<v1::ParameterServer::Stub> GrpcPushForwarder::StubFor(int ps) {
  absl::MutexLock lock(&mu_);
  if (ps < 0 || ps >= static_cast<int>(addresses_.size()) || addresses_[ps].empty()) {
    return nullptr;
  }
  auto& [address, stub] = stubs_[ps];
  if (stub == nullptr || address != addresses_[ps]) {
    address = addresses_[ps];
    stub = v1::ParameterServer::NewStub(NewGrpcChannel(address, channel_));
  }
  return stub;
}

absl::Status GrpcPushForwarder::ForwardOne(const DenseForward& forward) {
  std::shared_ptr<v1::ParameterServer::Stub> stub = StubFor(forward.backup);
  if (stub == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no address for backup ps:", forward.backup,
                     " (CreateShardsRequest.ps_addresses did not name it)"));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(absl::ToInt64Microseconds(timeout_)));
  v1::ReplicateResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ReplicateRequest>> writer =
      stub->Replicate(&ctx, &response);
  v1::ReplicateRequest msg;
  *msg.mutable_header() = forward.header;
  msg.mutable_header()->set_primary_ps_task(self_);
  bool sent = writer->Write(msg);
  const int64_t per_chunk = kChunkBytes / static_cast<int64_t>(sizeof(float));
  for (size_t i = 0; sent && i < forward.grads.size(); ++i) {
    const std::vector<float>& grad = forward.grads[i];
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
    const absl::Status status = FromGrpcStatus(s);
    return absl::Status(status.code(), absl::StrCat("forward to backup ps:", forward.backup, ": ",
                                                    s.error_message()));
  }
  return absl::OkStatus();
}

absl::Status GrpcPushForwarder::Forward(const ForwardList& list) {
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
