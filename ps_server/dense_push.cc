#include "ps_server/dense_push.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "ps_server/float_stats.h"

namespace pscluster {

absl::Status DensePush::CheckChunk(int index, int64_t offset, int64_t count) const {
  if (index < 0 || index >= num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk for shard index ", index,
                                                   " of a push naming ", num_shards(), " shards"));
  }
  const Buffer& b = grads_[index];
  const DenseShard& shard = *shards_[index];
  // Written so that no sum can overflow, whatever offset and count a client sends.
  if (offset < 0 || count < 0 || offset > b.size || count > b.size - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", count, " elements at offset ", offset, " does not fit variable ",
                     DenseName(shard.name(), shard.partition()), " of ", b.size, " elements"));
  }
  if (offset != b.received) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk at offset ", offset, " of variable ", DenseName(shard.name(), shard.partition()),
        " out of order: ", b.received,
        " elements have arrived, so the next chunk must start there (chunks of a shard come in "
        "order, each element once)"));
  }
  return absl::OkStatus();
}

absl::Status DensePush::Scan(int index, int64_t offset, int64_t count, ThreadPool* pool) const {
  if (allow_non_finite_) return absl::OkStatus();
  const float* g = grads_[index].values() + offset;
  const int64_t bad = FindNonFinite(g, count, pool);
  if (bad < 0) return absl::OkStatus();
  const DenseShard& shard = *shards_[index];
  return absl::InvalidArgumentError(absl::StrCat(
      "variable ", DenseName(shard.name(), shard.partition()), ": gradient element ", offset + bad,
      " is ", g[bad], "; NaN and Inf gradients are refused (ps_server --nan_policy)"));
}

absl::Status DensePush::AddChunk(int index, int64_t offset, absl::string_view bytes) {
  if (bytes.size() % elem_bytes_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a chunk of ", bytes.size(), " bytes is not a whole number of ",
                     v1::DataType_Name(wire_), " elements (", elem_bytes_, " bytes each)"));
  }
  const int64_t count = static_cast<int64_t>(bytes.size()) / elem_bytes_;
  PS_RETURN_IF_ERROR(CheckChunk(index, offset, count));
  Buffer& b = grads_[index];
  PS_RETURN_IF_ERROR(DecodeFloats(bytes, wire_, b.data.data() + offset, count));
  PS_RETURN_IF_ERROR(Scan(index, offset, count));
  b.received += count;
  received_bytes_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::StatusOr<float*> DensePush::Destination(int index, int64_t offset, int64_t count) {
  if (wire_ != v1::DT_FLOAT32) {
    return absl::InternalError("Destination() is for float32 pushes; use AddChunk()");
  }
  PS_RETURN_IF_ERROR(CheckChunk(index, offset, count));
  return grads_[index].data.data() + offset;
}

absl::Status DensePush::UseFloats(int index, const float* values, int64_t count) {
  if (wire_ != v1::DT_FLOAT32) {
    return absl::InternalError("UseFloats() is for float32 pushes; use AddChunk()");
  }
  PS_RETURN_IF_ERROR(CheckChunk(index, 0, count));
  if (count != grads_[index].size) {
    return absl::InvalidArgumentError(
        absl::StrCat("UseFloats of ", count, " elements for a shard of ", grads_[index].size));
  }
  grads_[index].view = values;
  grads_[index].scanned = allow_non_finite_;
  grads_[index].received = count;
  received_bytes_ += count * elem_bytes_;
  return absl::OkStatus();
}

absl::Status DensePush::ScanDeferred(ThreadPool* pool) {
  for (int i = 0; i < num_shards(); ++i) {
    Buffer& b = grads_[i];
    if (b.scanned) continue;
    PS_RETURN_IF_ERROR(Scan(i, 0, b.size, pool));
    b.scanned = true;
  }
  return absl::OkStatus();
}

absl::Status DensePush::Received(int index, int64_t offset, int64_t count) {
  PS_RETURN_IF_ERROR(CheckChunk(index, offset, count));
  PS_RETURN_IF_ERROR(Scan(index, offset, count));
  grads_[index].received += count;
  received_bytes_ += count * elem_bytes_;
  return absl::OkStatus();
}

// ---- DensePushPool

std::unique_ptr<DensePush> DensePushPool::Take() {
  absl::MutexLock lock(&mu_);
  if (idle_.empty()) return std::make_unique<DensePush>();
  std::unique_ptr<DensePush> p = std::move(idle_.back());
  idle_.pop_back();
  return p;
}

void DensePushPool::Return(std::unique_ptr<DensePush> push) {
  absl::MutexLock lock(&mu_);
  // A bounded pool: more pushes at once than this allocate for themselves.
  if (idle_.size() < 16) idle_.push_back(std::move(push));
}

}  // namespace pscluster
