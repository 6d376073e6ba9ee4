#include "ps_server/in_process_ps_transport.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"

namespace pscluster {
namespace {

// What travelling over the wire does to values: encode, decode.
absl::Status RoundTrip(const float* in, int64_t n, v1::DataType wire, float* out) {
  if (wire == v1::DT_INVALID || wire == v1::DT_FLOAT32) {
    std::copy(in, in + n, out);
    return absl::OkStatus();
  }
  std::string bytes;
  PS_RETURN_IF_ERROR(EncodeFloats(in, n, wire, &bytes));
  return DecodeFloats(bytes, wire, out, n);
}

}  // namespace

InProcessPsTransport::InProcessPsTransport(int num_ps, const ParameterStoreOptions& options)
    : fail_next_(num_ps, 0), calls_(num_ps, 0) {
  for (int i = 0; i < num_ps; ++i) stores_.push_back(std::make_unique<ParameterStore>(options));
}

void InProcessPsTransport::FailNextCalls(int ps, int n) {
  absl::MutexLock lock(&mu_);
  fail_next_[ps] = n;
}

int InProcessPsTransport::calls(int ps) const {
  absl::MutexLock lock(&mu_);
  return calls_[ps];
}

absl::Status InProcessPsTransport::Enter(int ps) {
  absl::MutexLock lock(&mu_);
  ++calls_[ps];
  if (fail_next_[ps] > 0) {
    --fail_next_[ps];
    return absl::UnavailableError(absl::StrCat("ps:", ps, " is unavailable (injected)"));
  }
  return absl::OkStatus();
}

absl::Status InProcessPsTransport::CreateShards(int ps, const v1::CreateShardsRequest& request,
                                                v1::CreateShardsResponse* response) {
  PS_RETURN_IF_ERROR(Enter(ps));
  return stores_[ps]->CreateShards(request, response);
}

absl::Status InProcessPsTransport::PullDense(int ps, const std::vector<DenseSlice>& slices,
                                             v1::DataType wire_dtype, int64_t step) {
  PS_RETURN_IF_ERROR(Enter(ps));
  google::protobuf::RepeatedPtrField<v1::ShardRef> refs;
  for (const DenseSlice& s : slices) *refs.Add() = s.ref;
  PS_ASSIGN_OR_RETURN(auto shards, stores_[ps]->FindDense(refs));
  stores_[ps]->SettleDense(shards, step);
  for (size_t i = 0; i < slices.size(); ++i) {
    if (shards[i]->num_elements() != slices[i].num_elements) {
      return absl::DataLossError(absl::StrCat("ps:", ps, " holds ", shards[i]->num_elements(),
                                              " elements of ", slices[i].ref.variable(),
                                              ", the caller expects ", slices[i].num_elements));
    }
    std::vector<float> values(slices[i].num_elements);
    shards[i]->ReadValues(values.data());
    PS_RETURN_IF_ERROR(
        RoundTrip(values.data(), values.size(), wire_dtype, slices[i].pull_into));
  }
  return absl::OkStatus();
}

absl::Status InProcessPsTransport::PushDense(int ps, const std::vector<DenseSlice>& slices,
                                             v1::DataType wire_dtype, int64_t step,
                                             int32_t worker, v1::PushDenseResponse* response) {
  PS_RETURN_IF_ERROR(Enter(ps));
  google::protobuf::RepeatedPtrField<v1::ShardRef> refs;
  for (const DenseSlice& s : slices) *refs.Add() = s.ref;
  PS_ASSIGN_OR_RETURN(auto shards, stores_[ps]->FindDense(refs));
  std::vector<std::vector<float>> grads(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    grads[i].resize(slices[i].num_elements);
    PS_RETURN_IF_ERROR(
        RoundTrip(slices[i].push_from, slices[i].num_elements, wire_dtype, grads[i].data()));
  }
  return stores_[ps]->PushDense(shards, grads, 0, step, worker, response);
}

absl::Status InProcessPsTransport::PullSparse(int ps, const std::string& table,
                                              const int64_t* keys, int64_t n, int64_t dim,
                                              v1::DataType wire_dtype, int64_t step, float* out) {
  PS_RETURN_IF_ERROR(Enter(ps));
  std::vector<float> rows(n * dim);
  PS_RETURN_IF_ERROR(stores_[ps]->PullSparse(table, keys, n, rows.data(), 0, step));
  return RoundTrip(rows.data(), rows.size(), wire_dtype, out);
}

absl::Status InProcessPsTransport::PushSparse(int ps, const std::string& table,
                                              const int64_t* keys, int64_t n, int64_t dim,
                                              const float* grads, v1::DataType wire_dtype,
                                              int64_t step, int32_t worker,
                                              v1::PushSparseResponse* response) {
  PS_RETURN_IF_ERROR(Enter(ps));
  std::vector<float> g(n * dim);
  PS_RETURN_IF_ERROR(RoundTrip(grads, g.size(), wire_dtype, g.data()));
  return stores_[ps]->PushSparse(table, keys, n, g.data(), 0, step, worker, response);
}

absl::StatusOr<v1::ListShardsResponse> InProcessPsTransport::ListShards(int ps) {
  PS_RETURN_IF_ERROR(Enter(ps));
  return stores_[ps]->ListShards();
}

absl::StatusOr<v1::InspectShardResponse> InProcessPsTransport::InspectShard(
    int ps, const v1::InspectShardRequest& request) {
  PS_RETURN_IF_ERROR(Enter(ps));
  return stores_[ps]->Inspect(request);
}

absl::Status InProcessPsTransport::SaveShards(int ps, const v1::SaveShardsRequest& request,
                                              v1::SaveShardsResponse* response) {
  PS_RETURN_IF_ERROR(Enter(ps));
  return stores_[ps]->Save(request, response);
}

absl::Status InProcessPsTransport::RestoreShards(int ps, const v1::RestoreShardsRequest& request,
                                                 v1::RestoreShardsResponse* response) {
  PS_RETURN_IF_ERROR(Enter(ps));
  return stores_[ps]->Restore(request, response);
}

}  // namespace pscluster
