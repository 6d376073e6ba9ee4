#include "ps_server/dense_shard.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "ps_server/initializer.h"

namespace pscluster {

void ShardCounters::FillStats(v1::ShardStats* stats) const {
  stats->set_pushes(pushes.load(std::memory_order_relaxed));
  stats->set_pulls(pulls.load(std::memory_order_relaxed));
  stats->set_bytes_in(bytes_in.load(std::memory_order_relaxed));
  stats->set_bytes_out(bytes_out.load(std::memory_order_relaxed));
  stats->set_last_update_unix_micros(last_update_unix_micros.load(std::memory_order_relaxed));
  stats->set_dropped_stale(dropped_stale.load(std::memory_order_relaxed));
}

void ComputeFloatStats(const float* values, int64_t n, v1::ValueStats* stats) {
  int64_t count = 0, nan = 0, inf = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -min;
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = values[i];
    if (std::isnan(v)) {
      ++nan;
    } else if (std::isinf(v)) {
      ++inf;
    } else {
      ++count;
      min = std::min(min, v);
      max = std::max(max, v);
      sum += v;
      sum_sq += v * v;
    }
  }
  stats->set_count(count);
  stats->set_nan_count(nan);
  stats->set_inf_count(inf);
  if (count == 0) return;
  const double mean = sum / count;
  stats->set_min(min);
  stats->set_max(max);
  stats->set_mean(mean);
  stats->set_std(std::sqrt(std::max(0.0, sum_sq / count - mean * mean)));
  stats->set_l2_norm(std::sqrt(sum_sq));
}

int64_t FindNonFinite(const float* v, int64_t n) {
  // A branch-free pass first (vectorizes); only a hit pays for the search.
  uint32_t all_exp = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], sizeof(bits));
    all_exp |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (all_exp == 0) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return -1;
}

absl::StatusOr<std::unique_ptr<DenseShard>> DenseShard::Create(const v1::DenseShardSpec& spec) {
  const v1::VariableSpec& var = spec.variable();
  const v1::DensePartition& part = spec.partition();
  if (var.name().empty()) return absl::InvalidArgumentError("a variable has an empty name");
  if (var.dtype() != v1::DT_FLOAT32 && var.dtype() != v1::DT_INVALID) {
    return absl::InvalidArgumentError(absl::StrCat("variable ", var.name(), " has dtype ",
                                                   v1::DataType_Name(var.dtype()),
                                                   "; only DT_FLOAT32 variables are supported"));
  }
  const auto& dims = var.shape().dims();
  int64_t rows = dims.empty() ? 1 : dims[0];
  int64_t row_elements = 1;
  for (int i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", var.name(), " has negative dimension ", dims[i]));
    }
    if (i > 0) row_elements *= dims[i];
  }
  if (part.row_begin() < 0 || part.row_end() < part.row_begin() || part.row_end() > rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variable ", var.name(), " partition ", part.partition(), ": rows [", part.row_begin(),
        ", ", part.row_end(), ") are not within the variable's ", rows, " rows"));
  }
  v1::TensorShape shape;
  if (!dims.empty()) {
    shape.add_dims(part.row_end() - part.row_begin());
    for (int i = 1; i < dims.size(); ++i) shape.add_dims(dims[i]);
  }
  const int64_t n = (part.row_end() - part.row_begin()) * row_elements;
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::Create(var.optimizer());
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", var.name(), ": ", optimizer.status().message()));
  }
  auto shard =
      std::unique_ptr<DenseShard>(new DenseShard(spec, std::move(shape), n, *std::move(optimizer)));
  absl::MutexLock lock(&shard->mu_);
  const int slots = shard->optimizer_->num_slots();
  shard->data_.assign(static_cast<size_t>(n) * (1 + slots), 0.0f);
  absl::Status init = InitializeDense(var.initializer(), var.name(), var.shape(),
                                      part.row_begin() * row_elements, shard->data_.data(), n);
  if (!init.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("variable ", var.name(), ": ", init.message()));
  }
  for (int s = 0; s < slots; ++s) {
    std::fill_n(shard->data_.begin() + (1 + s) * n, n, shard->optimizer_->slot_initial_value(s));
  }
  return shard;
}

DenseShard::DenseShard(v1::DenseShardSpec spec, v1::TensorShape shape, int64_t num_elements,
                       std::unique_ptr<Optimizer> optimizer)
    : spec_(std::move(spec)),
      shape_(std::move(shape)),
      num_elements_(num_elements),
      optimizer_(std::move(optimizer)) {}

int64_t DenseShard::bytes() const {
  return num_elements_ * (1 + optimizer_->num_slots()) * static_cast<int64_t>(sizeof(float));
}

void DenseShard::ReadValues(float* out) const {
  absl::ReaderMutexLock lock(&mu_);
  std::memcpy(out, data_.data(), num_elements_ * sizeof(float));
}

void DenseShard::Apply(const float* grad) {
  absl::MutexLock lock(&mu_);
  const int slots = optimizer_->num_slots();
  float* slot_ptrs[8];
  for (int s = 0; s < slots; ++s) slot_ptrs[s] = data_.data() + (1 + s) * num_elements_;
  ++updates_;
  optimizer_->Apply(data_.data(), slot_ptrs, grad, num_elements_, updates_);
  counters_.last_update_unix_micros.store(absl::ToUnixMicros(absl::Now()),
                                          std::memory_order_relaxed);
}

int64_t DenseShard::updates() const {
  absl::ReaderMutexLock lock(&mu_);
  return updates_;
}

void DenseShard::ComputeValueStats(v1::ValueStats* stats) const {
  absl::ReaderMutexLock lock(&mu_);
  ComputeFloatStats(data_.data(), num_elements_, stats);
}

void DenseShard::Snapshot(std::vector<float>* values_and_slots, int64_t* updates) const {
  absl::ReaderMutexLock lock(&mu_);
  *values_and_slots = data_;
  *updates = updates_;
}

absl::Status DenseShard::Restore(const std::vector<float>& values_and_slots, int64_t updates) {
  absl::MutexLock lock(&mu_);
  if (values_and_slots.size() != data_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variable ", name(), " partition ", partition(), ": restoring ", values_and_slots.size(),
        " floats (values and slots) into a shard of ", data_.size()));
  }
  data_ = values_and_slots;
  updates_ = updates;
  return absl::OkStatus();
}

}  // namespace pscluster
