#include "ps_server/in_process_ps_transport.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"

namespace pscluster {
namespace {

// float32 values as the bytes that would travel, without a copy; other dtypes encoded.
absl::string_view WireBytes(const float* values, int64_t n, v1::DataType wire,
                            std::string* scratch) {
  if (WireOrFloat(wire) == v1::DT_FLOAT32) {
    return absl::string_view(reinterpret_cast<const char*>(values), n * sizeof(float));
  }
  scratch->clear();
  EncodeFloats(values, n, wire, scratch).IgnoreError();  // the store reports a bad dtype
  return *scratch;
}

// Decodes a pull's values into caller memory, as a client of the network would.
class SliceSink : public DensePullSink {
 public:
  SliceSink(int ps, const std::vector<DenseSlice>& slices, v1::DataType wire)
      : ps_(ps), slices_(slices), wire_(WireOrFloat(wire)) {}

  absl::Status Begin(const std::vector<int64_t>& num_elements) override {
    for (size_t i = 0; i < slices_.size(); ++i) {
      if (num_elements[i] != slices_[i].num_elements) {
        return absl::DataLossError(absl::StrCat("ps:", ps_, " holds ", num_elements[i],
                                                " elements of ", slices_[i].ref.variable(),
                                                ", the caller expects ", slices_[i].num_elements));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Values(int index, const float* values, int64_t n) override {
    if (wire_ == v1::DT_FLOAT32) {
      std::copy_n(values, n, slices_[index].pull_into);
      return absl::OkStatus();
    }
    PS_RETURN_IF_ERROR(EncodeFloats(values, n, wire_, &scratch_));
    absl::Status s = DecodeFloats(scratch_, wire_, slices_[index].pull_into, n);
    scratch_.clear();
    return s;
  }

 private:
  const int ps_;
  const std::vector<DenseSlice>& slices_;
  const v1::DataType wire_;
  std::string scratch_;
};

}  // namespace

InProcessPsTransport::InProcessPsTransport(int num_ps, const ParameterStoreOptions& options)
    : InProcessPsTransport(std::make_shared<Stores>(options), num_ps) {
  absl::MutexLock lock(&stores_->mu);
  for (int i = 0; i < num_ps; ++i) {
    stores_->stores.push_back(std::make_shared<ParameterStore>(options));
  }
}

InProcessPsTransport::InProcessPsTransport(std::shared_ptr<Stores> stores, int num_ps)
    : stores_(std::move(stores)), num_ps_(num_ps), fail_next_(num_ps, 0), calls_(num_ps, 0) {}

std::unique_ptr<InProcessPsTransport> InProcessPsTransport::Share() const {
  return std::unique_ptr<InProcessPsTransport>(new InProcessPsTransport(stores_, num_ps_));
}

void InProcessPsTransport::RestartTask(int ps) {
  auto fresh = std::make_shared<ParameterStore>(stores_->options);
  absl::MutexLock lock(&stores_->mu);
  stores_->stores[ps] = std::move(fresh);
}

std::shared_ptr<ParameterStore> InProcessPsTransport::Store(int ps) const {
  absl::MutexLock lock(&stores_->mu);
  return stores_->stores[ps];
}

void InProcessPsTransport::FailNextCalls(int ps, int n) {
  absl::MutexLock lock(&mu_);
  fail_next_[ps] = n;
}

int InProcessPsTransport::calls(int ps) const {
  absl::MutexLock lock(&mu_);
  return calls_[ps];
}

absl::StatusOr<std::shared_ptr<ParameterStore>> InProcessPsTransport::Enter(int ps) {
  {
    absl::MutexLock lock(&mu_);
    ++calls_[ps];
    if (fail_next_[ps] > 0) {
      --fail_next_[ps];
      return absl::UnavailableError(absl::StrCat("ps:", ps, " is unavailable (injected)"));
    }
  }
  return Store(ps);
}

absl::Status InProcessPsTransport::CreateShards(int ps, const v1::CreateShardsRequest& request,
                                                v1::CreateShardsResponse* response) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  return store->CreateShards(request, response);
}

absl::Status InProcessPsTransport::PullDense(int ps, const std::vector<DenseSlice>& slices,
                                             v1::DataType wire_dtype, int64_t step) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  v1::PullDenseRequest req;
  for (const DenseSlice& s : slices) *req.add_shards() = s.ref;
  req.set_wire_dtype(WireOrFloat(wire_dtype));
  if (step >= 0) req.set_step(step);
  SliceSink sink(ps, slices, wire_dtype);
  return store->PullDense(req, &sink);
}

absl::Status InProcessPsTransport::PushDense(int ps, const std::vector<DenseSlice>& slices,
                                             const PushMeta& meta,
                                             v1::PushDenseResponse* response) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  v1::PushDenseHeader header;
  for (const DenseSlice& s : slices) {
    *header.add_shards() = s.ref;
    header.add_num_elements(s.num_elements);
  }
  header.set_wire_dtype(WireOrFloat(meta.wire_dtype));
  header.set_step(meta.step);
  header.set_worker(meta.worker);
  header.set_delta(meta.delta);
  *header.mutable_request_id() = meta.request_id;
  std::unique_ptr<DensePush> push = pushes_.Take();
  absl::Status s = store->StartPushDense(header, push.get());
  std::string scratch;
  const bool float32 = WireOrFloat(meta.wire_dtype) == v1::DT_FLOAT32;
  for (size_t i = 0; i < slices.size() && s.ok(); ++i) {
    // float32 gradients are used where they lie, as a zero-copy transport would.
    s = float32 ? push->UseFloats(static_cast<int>(i), slices[i].push_from, slices[i].num_elements)
                : push->AddChunk(static_cast<int>(i), 0,
                                 WireBytes(slices[i].push_from, slices[i].num_elements,
                                           meta.wire_dtype, &scratch));
  }
  if (s.ok()) s = store->FinishPushDense(push.get(), response);
  pushes_.Return(std::move(push));
  return s;
}

absl::Status InProcessPsTransport::PullSparse(int ps, const std::string& table, const int64_t* keys,
                                              int64_t n, int64_t dim, v1::DataType wire_dtype,
                                              int64_t step, float* out) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  v1::PullSparseRequest req;
  req.set_table(table);
  req.set_wire_dtype(WireOrFloat(wire_dtype));
  if (step >= 0) req.set_step(step);
  std::vector<float> rows;
  PS_RETURN_IF_ERROR(store->PullSparse(req, keys, n, &rows));
  if (static_cast<int64_t>(rows.size()) != n * dim) {
    return absl::DataLossError(absl::StrCat("ps:", ps, " answered a pull of ", n, " rows of ",
                                            table, " with ", rows.size(), " values, expected ",
                                            n * dim));
  }
  std::string scratch;
  return DecodeFloats(WireBytes(rows.data(), n * dim, wire_dtype, &scratch),
                      WireOrFloat(wire_dtype), out, n * dim);
}

absl::Status InProcessPsTransport::PushSparse(int ps, const std::string& table, const int64_t* keys,
                                              int64_t n, int64_t dim, const float* grads,
                                              const PushMeta& meta,
                                              v1::PushSparseResponse* response) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  v1::PushSparseRequest req;
  req.set_table(table);
  req.set_wire_dtype(WireOrFloat(meta.wire_dtype));
  req.set_step(meta.step);
  req.set_worker(meta.worker);
  *req.mutable_request_id() = meta.request_id;
  req.set_part(meta.part);
  req.set_num_parts(meta.num_parts);
  std::string scratch;
  return store->PushSparse(req, keys, n, WireBytes(grads, n * dim, meta.wire_dtype, &scratch),
                           response);
}

absl::StatusOr<v1::ListShardsResponse> InProcessPsTransport::ListShards(
    int ps, const v1::ListShardsRequest& request) {
  // An in-process store holds no backups (CreateShardsRequest.backups is for ps_server).
  (void)request;
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  return store->ListShards();
}

absl::StatusOr<v1::InspectShardResponse> InProcessPsTransport::InspectShard(
    int ps, const v1::InspectShardRequest& request) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  return store->Inspect(request);
}

absl::Status InProcessPsTransport::SaveShards(int ps, const v1::SaveShardsRequest& request,
                                              v1::SaveShardsResponse* response) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  return store->Save(request, response);
}

absl::Status InProcessPsTransport::RestoreShards(int ps, const v1::RestoreShardsRequest& request,
                                                 v1::RestoreShardsResponse* response) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  return store->Restore(request, response);
}

absl::StatusOr<v1::TaskStatus> InProcessPsTransport::GetStatus(int ps) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<ParameterStore> store, Enter(ps));
  v1::TaskStatus status;
  status.mutable_task()->set_job("ps");
  status.mutable_task()->set_index(ps);
  status.set_address(absl::StrCat("in-process:", ps));
  status.set_health(v1::HEALTH_SERVING);
  status.set_detail(
      absl::StrCat(store->total_pushes(), " pushes, ", store->total_pulls(), " pulls"));
  return status;
}

}  // namespace pscluster
