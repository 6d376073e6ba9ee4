#include "ps_server/dense_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/denormal.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "ps_server/initializer.h"
#include "sharding/partitioner.h"

namespace pscluster {

void ShardCounters::FillStats(v1::ShardStats* stats) const {
  stats->set_pushes(pushes.load(std::memory_order_relaxed));
  stats->set_pulls(pulls.load(std::memory_order_relaxed));
  stats->set_bytes_in(bytes_in.load(std::memory_order_relaxed));
  stats->set_bytes_out(bytes_out.load(std::memory_order_relaxed));
  stats->set_last_update_unix_micros(last_update_unix_micros.load(std::memory_order_relaxed));
  stats->set_dropped_stale(dropped_stale.load(std::memory_order_relaxed));
}

namespace {

// What a spec describes, validated: the shard's shape, element count and the element offset
// of its first row in the whole variable.
struct DenseGeometry {
  v1::TensorShape shape;
  int64_t num_elements = 0;
  int64_t first_element = 0;
};

absl::StatusOr<DenseGeometry> GeometryOf(const v1::DenseShardSpec& spec) {
  const v1::VariableSpec& var = spec.variable();
  const v1::DensePartition& part = spec.partition();
  if (var.name().empty()) return absl::InvalidArgumentError("a variable has an empty name");
  if (var.dtype() != v1::DT_FLOAT32 && var.dtype() != v1::DT_INVALID) {
    return absl::InvalidArgumentError(absl::StrCat("variable ", var.name(), " has dtype ",
                                                   v1::DataType_Name(var.dtype()),
                                                   "; only DT_FLOAT32 variables are supported"));
  }
  // Every size below is checked against this bound before it is multiplied, so no product
  // overflows: a request for 10^12 elements is a clear error, not a wrapped number.
  constexpr int64_t kMaxElements = int64_t{1} << 56;
  const auto& dims = var.shape().dims();
  const int64_t rows = dims.empty() ? 1 : dims[0];
  int64_t row_elements = 1;
  for (int i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", var.name(), " has negative dimension ", dims[i]));
    }
    if (i > 0) {
      if (dims[i] != 0 && row_elements > kMaxElements / dims[i]) {
        return absl::InvalidArgumentError(absl::StrCat("variable ", var.name(), " of shape ",
                                                       absl::StrJoin(dims, "x"), " is too large"));
      }
      row_elements *= dims[i];
    }
  }
  // -1 is a table's partition number (ShardStats, SavedShard, InspectShardRequest).
  if (part.partition() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("variable ", var.name(), " partition ",
                                                   part.partition(),
                                                   ": a partition index must be >= 0"));
  }
  if (part.row_begin() < 0 || part.row_end() < part.row_begin() || part.row_end() > rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variable ", var.name(), " partition ", part.partition(), ": rows [", part.row_begin(),
        ", ", part.row_end(), ") are not within the variable's ", rows, " rows"));
  }
  if (row_elements != 0 && rows > kMaxElements / row_elements) {
    return absl::InvalidArgumentError(absl::StrCat("variable ", var.name(), " of shape [",
                                                   absl::StrJoin(dims, ", "), "] is too large"));
  }
  DenseGeometry g;
  if (!dims.empty()) {
    g.shape.add_dims(part.row_end() - part.row_begin());
    for (int i = 1; i < dims.size(); ++i) g.shape.add_dims(dims[i]);
  }
  const ElementRange elements = ElementsOf(part, row_elements);
  g.num_elements = elements.size;
  g.first_element = elements.begin;
  return g;
}

}  // namespace

absl::StatusOr<int64_t> DenseShard::BytesFor(const v1::DenseShardSpec& spec) {
  PS_ASSIGN_OR_RETURN(DenseGeometry g, GeometryOf(spec));
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(spec.variable().optimizer());
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", spec.variable().name(), ": ", optimizer.status().message()));
  }
  return g.num_elements * (1 + (*optimizer)->num_slots()) * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<std::unique_ptr<DenseShard>> DenseShard::Create(const v1::DenseShardSpec& spec) {
  const v1::VariableSpec& var = spec.variable();
  PS_ASSIGN_OR_RETURN(DenseGeometry geometry, GeometryOf(spec));
  v1::TensorShape shape = std::move(geometry.shape);
  const int64_t n = geometry.num_elements;
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
                                      geometry.first_element, shard->data_.data(), n);
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

namespace {

// Blocks below this size are not worth a hand-off to another thread. Measured both ways with
// the MLP's push (bench/train_bench, Adam over 269,322 parameters): on the 16-core GPU host,
// with denormals flushed, blocks of 8K elements on the apply pool take 0.19-0.21 ms and one
// thread 0.36 ms; on a 2-vCPU machine the other way round, 0.30-0.40 against 0.22-0.27 ms,
// because waking the second vCPU costs about what Adam takes over 100K elements. Hosts with
// cores to spare are what a ps task is meant for, so the small block stays.
constexpr int64_t kMinParallelBlock = 8 << 10;

}  // namespace

void DenseShard::ApplyRangeLocked(const float* grad, int64_t t, int64_t begin, int64_t end) {
  float* const data = data_.data();
  float* slot_ptrs[8];
  for (int s = 0; s < optimizer_->num_slots(); ++s) {
    slot_ptrs[s] = data + (1 + s) * num_elements_ + begin;
  }
  ScopedFlushDenormals flush;  // as every optimizer update (optimizer.h)
  optimizer_->Apply(data + begin, slot_ptrs, grad + begin, end - begin, t);
}

void DenseShard::AddRangeLocked(const float* delta, int64_t begin, int64_t end) {
  float* const data = data_.data();
  ScopedFlushDenormals flush;
  for (int64_t i = begin; i < end; ++i) data[i] += delta[i];
}

void DenseShard::Apply(const float* grad, ThreadPool* pool) { ApplyAll({this}, {grad}, pool); }

// The locks are taken and released in loops, which the thread-safety analysis cannot follow;
// ApplyRangeLocked's requirement holds because every shard's lock is held for the whole loop.
void DenseShard::ApplyAll(const std::vector<DenseShard*>& shards,
                          const std::vector<const float*>& grads, ThreadPool* pool, bool delta,
                          std::vector<int64_t>* updates_after,
                          std::vector<std::pair<int, int64_t>>* backups,
                          const OrderedFn& ordered) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const size_t n = shards.size();
  if (updates_after != nullptr) updates_after->clear();
  if (backups != nullptr) backups->clear();
  if (n == 0) return;
  std::vector<DenseShard*> lock_order = shards;
  std::sort(lock_order.begin(), lock_order.end(), std::less<DenseShard*>());
  for (DenseShard* shard : lock_order) shard->mu_.Lock();
  // start[i]: where shard i's elements begin in the concatenation of all of them.
  std::vector<int64_t> start(n + 1, 0);
  std::vector<int64_t> t(n);
  for (size_t i = 0; i < n; ++i) {
    start[i + 1] = start[i] + shards[i]->num_elements_;
    t[i] = ++shards[i]->updates_;
  }
  if (updates_after != nullptr) *updates_after = t;
  if (backups != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      backups->emplace_back(shards[i]->backup_ps_task(), shards[i]->backup_generation());
    }
  }
  if (ordered != nullptr && updates_after != nullptr && backups != nullptr) {
    ordered(*updates_after, *backups);
  }
  const auto apply = [&](int64_t begin, int64_t end) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // The shards overlapping [begin, end), each over its part of the range.
    size_t i = std::upper_bound(start.begin(), start.end(), begin) - start.begin() - 1;
    for (; i < n && start[i] < end; ++i) {
      const int64_t from = std::max(begin, start[i]) - start[i];
      const int64_t to = std::min(end, start[i + 1]) - start[i];
      if (from >= to) continue;
      if (delta) {
        shards[i]->AddRangeLocked(grads[i], from, to);
      } else {
        shards[i]->ApplyRangeLocked(grads[i], t[i], from, to);
      }
    }
  };
  const int64_t total = start[n];
  if (pool == nullptr || total < 2 * kMinParallelBlock) {
    apply(0, total);
  } else {
    pool->ParallelFor(total, kMinParallelBlock, apply);
  }
  const int64_t now = absl::ToUnixMicros(absl::Now());
  for (DenseShard* shard : shards) {
    shard->counters_.last_update_unix_micros.store(now, std::memory_order_relaxed);
  }
  for (auto it = lock_order.rbegin(); it != lock_order.rend(); ++it) (*it)->mu_.Unlock();
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

void DenseShard::set_backup_ps_task(int task, int64_t generation) {
  absl::MutexLock lock(&mu_);
  backup_generation_.store(generation, std::memory_order_relaxed);
  backup_ps_task_.store(task, std::memory_order_relaxed);
}

absl::Status DenseShard::CopyAndSetBackup(int backup, int64_t generation, std::string* bytes,
                                          int64_t* updates, const std::function<void()>& at_copy) {
  bytes->resize(static_cast<size_t>(state_bytes()));  // (allocated before the lock)
  absl::MutexLock lock(&mu_);
  const int current = backup_ps_task_.load(std::memory_order_relaxed);
  if (current >= 0 && current != backup) {
    bytes->clear();
    return absl::FailedPreconditionError(
        absl::StrCat(DenseName(name(), partition()), " is backed up on ps:", current,
                     " already; a new backup on ps:", backup, " would leave that one behind"));
  }
  std::memcpy(bytes->data(), data_.data(), data_.size() * sizeof(float));
  *updates = updates_;
  backup_generation_.store(generation, std::memory_order_relaxed);
  backup_ps_task_.store(backup, std::memory_order_relaxed);
  if (at_copy) at_copy();
  return absl::OkStatus();
}

bool DenseShard::ClearBackupIf(int backup, int64_t generation) {
  absl::MutexLock lock(&mu_);
  if (backup_ps_task_.load(std::memory_order_relaxed) != backup ||
      backup_generation_.load(std::memory_order_relaxed) != generation) {
    return false;
  }
  backup_ps_task_.store(-1, std::memory_order_relaxed);
  return true;
}

absl::Status DenseShard::InstallCopy(absl::string_view bytes, int64_t updates, bool* installed) {
  *installed = false;
  absl::MutexLock lock(&mu_);
  if (bytes.size() != data_.size() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variable ", name(), " partition ", partition(), ": a copy of ", bytes.size(),
        " bytes for a shard whose values and slots take ", data_.size() * sizeof(float)));
  }
  if (updates_ >= updates) return absl::OkStatus();
  std::memcpy(data_.data(), bytes.data(), bytes.size());
  updates_ = updates;
  *installed = true;
  return absl::OkStatus();
}

int64_t DenseShard::state_bytes() const {
  absl::ReaderMutexLock lock(&mu_);
  return static_cast<int64_t>(data_.size() * sizeof(float));
}

}  // namespace pscluster
