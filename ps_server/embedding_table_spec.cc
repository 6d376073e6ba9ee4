// EmbeddingTable made from its spec: the spec checked, the capacity and the memory a
// vocabulary table reserves, the stripes set up.

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ps_server/embedding_table.h"
#include "ps_server/embedding_table_internal.h"
#include "ps_server/initializer.h"

namespace pscluster {
namespace {

using embedding_table_internal::RowBytes;
using embedding_table_internal::TracksLast;
using embedding_table_internal::VocabularyRowBytes;
using embedding_table_internal::WithTablePrefix;

constexpr int64_t kDefaultSketchWidth = int64_t{1} << 20;
constexpr int64_t kMinSketchWidth = 4096;
constexpr int64_t kMaxSketchWidth = int64_t{1} << 26;

constexpr int64_t kMaxVocabulary = int64_t{1} << 48;

// OK, or INVALID_ARGUMENT naming the table, for a vocabulary_size out of range or a
// vocabulary table with admission or eviction.
absl::Status ValidateVocabulary(const v1::TableSpec& spec) {
  const int64_t v = spec.vocabulary_size();
  if (v < 0 || v > kMaxVocabulary) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.name(), ": vocabulary_size ", v,
                     ": expected 0 (a hashed table) or a number of ids in [1, 2^48]"));
  }
  if (v > 0 && (spec.has_admission() || spec.has_eviction())) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.name(), ": a vocabulary table (vocabulary_size ", v,
                     ") keeps a row for every id: admission and eviction are for hashed tables "
                     "(vocabulary_size 0)"));
  }
  return absl::OkStatus();
}

// A vocabulary table's rows on a task owning num_owned shards, and their bytes; or
// RESOURCE_EXHAUSTED past 2^62 bytes.
absl::StatusOr<int64_t> VocabularyBytes(const v1::TableSpec& spec, int64_t stride,
                                        int64_t num_owned, int32_t num_virtual_shards) {
  const int64_t rows_per_shard =
      (spec.vocabulary_size() + num_virtual_shards - 1) / num_virtual_shards;
  const double bytes = static_cast<double>(num_owned) * static_cast<double>(rows_per_shard) *
                       static_cast<double>(VocabularyRowBytes(stride));
  if (bytes > 0x1.0p62) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table ", spec.name(), ": vocabulary_size ", spec.vocabulary_size(),
                     " with dim ", spec.dim(), " needs ", bytes, " bytes on this ps task"));
  }
  return num_owned * rows_per_shard * VocabularyRowBytes(stride);
}

// Per-stripe sketch width: the spec's total width over the stripes, a power of two.
int64_t StripeSketchWidth(const v1::AdmissionSpec& a) {
  int64_t total = a.sketch_width() > 0 ? a.sketch_width() : kDefaultSketchWidth;
  total = std::max(total, kMinSketchWidth);
  int64_t width = 1;
  while (width * EmbeddingTable::kNumStripes < total) width *= 2;
  return width;
}
}  // namespace

absl::Status ValidateAdmissionAndEviction(const v1::TableSpec& spec) {
  const auto bad = [&spec](absl::string_view field, auto value, absl::string_view expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.name(), ": ", field, " ", value, ": expected ", expected));
  };
  const v1::AdmissionSpec& a = spec.admission();
  if (a.min_count() < 0 || a.min_count() > 65535) {
    return bad("admission.min_count", a.min_count(), "a count in [0, 65535]");
  }
  if (!(a.probability() >= 0 && a.probability() <= 1)) {
    return bad("admission.probability", a.probability(), "a probability in [0, 1]");
  }
  if (a.sketch_width() < 0 || a.sketch_width() > kMaxSketchWidth) {
    return bad("admission.sketch_width", a.sketch_width(), "0 (the default) to 2^26 counters");
  }
  const v1::EvictionSpec& e = spec.eviction();
  constexpr int64_t kMaxTtl = std::numeric_limits<uint32_t>::max();
  if (e.ttl_steps() < 0 || e.ttl_steps() > kMaxTtl) {
    return bad("eviction.ttl_steps", e.ttl_steps(), "0 (none) to 2^32 - 1 steps");
  }
  if (e.ttl_seconds() < 0 || e.ttl_seconds() > kMaxTtl) {
    return bad("eviction.ttl_seconds", e.ttl_seconds(), "0 (none) to 2^32 - 1 seconds");
  }
  if (e.ttl_steps() > 0 && e.ttl_seconds() > 0) {
    return bad("eviction.ttl_seconds", e.ttl_seconds(), "0 when ttl_steps is set (one TTL)");
  }
  if (e.max_rows() < 0) return bad("eviction.max_rows", e.max_rows(), "0 (no limit) or more");
  if (e.max_bytes() < 0) return bad("eviction.max_bytes", e.max_bytes(), "0 (no limit) or more");
  return absl::OkStatus();
}

constexpr int EmbeddingTable::kNumStripes;
constexpr int64_t EmbeddingTable::kMinParallelKeys;
absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    const v1::TableSpec& spec, std::vector<int32_t> owned_virtual_shards,
    int32_t num_virtual_shards) {
  if (spec.name().empty()) {
    return absl::InvalidArgumentError("table spec has an empty name");
  }
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  if (spec.dim() < 1 || spec.dim() >= kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.name(), ": dim ", spec.dim(), " is not in [1, 2^31)"));
  }
  absl::Status initializer_status = ValidateInitializer(spec.initializer());
  if (!initializer_status.ok()) return WithTablePrefix(spec.name(), initializer_status);
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::Create(spec.optimizer());
  if (!optimizer.ok()) return WithTablePrefix(spec.name(), optimizer.status());
  PS_RETURN_IF_ERROR(ValidateAdmissionAndEviction(spec));
  PS_RETURN_IF_ERROR(ValidateVocabulary(spec));
  // The capacity as rows per stripe: the tighter of max_rows and max_bytes.
  const v1::EvictionSpec& eviction = spec.eviction();
  const int64_t row_bytes =
      RowBytes(spec.dim() * (1 + int64_t{(*optimizer)->num_slots()}), TracksLast(eviction));
  int64_t capacity = eviction.max_rows();
  if (eviction.max_bytes() > 0) {
    const int64_t by_bytes = eviction.max_bytes() / row_bytes;
    if (by_bytes < kNumStripes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", spec.name(), ": eviction.max_bytes ", eviction.max_bytes(), " holds ", by_bytes,
          " rows of ", row_bytes, " bytes: expected room for at least ", kNumStripes,
          " (one per lock stripe)"));
    }
    capacity = capacity > 0 ? std::min(capacity, by_bytes) : by_bytes;
  }
  const int64_t stripe_capacity = capacity > 0 ? std::max<int64_t>(1, capacity / kNumStripes) : 0;
  if (num_virtual_shards <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("table ", spec.name(), ": num_virtual_shards ",
                                                   num_virtual_shards, " is not positive"));
  }
  std::vector<bool> owned(static_cast<size_t>(num_virtual_shards), false);
  for (int32_t shard : owned_virtual_shards) {
    if (shard < 0 || shard >= num_virtual_shards) {
      return absl::InvalidArgumentError(absl::StrCat("table ", spec.name(),
                                                     ": owned virtual shard ", shard,
                                                     " is not in [0, ", num_virtual_shards, ")"));
    }
    owned[static_cast<size_t>(shard)] = true;
  }
  if (spec.vocabulary_size() > 0) {
    const int64_t num_owned = std::count(owned.begin(), owned.end(), true);
    PS_RETURN_IF_ERROR(VocabularyBytes(spec, spec.dim() * (1 + int64_t{(*optimizer)->num_slots()}),
                                       num_owned, num_virtual_shards)
                           .status());
  }
  std::unique_ptr<EmbeddingTable> table(new EmbeddingTable(
      spec, *std::move(optimizer), std::move(owned), num_virtual_shards, stripe_capacity));
  if (!table->vocabulary_.usable()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table ", spec.name(), ": cannot allocate ", table->reserved_bytes(),
                     " bytes for the rows of vocabulary_size ", spec.vocabulary_size()));
  }
  return table;
}

absl::StatusOr<int64_t> EmbeddingTable::ReservedBytes(const v1::TableSpec& spec, int64_t num_owned,
                                                      int32_t num_virtual_shards) {
  PS_RETURN_IF_ERROR(ValidateVocabulary(spec));
  if (spec.vocabulary_size() == 0 || num_owned <= 0 || num_virtual_shards <= 0) return 0;
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::Create(spec.optimizer());
  if (!optimizer.ok()) return WithTablePrefix(spec.name(), optimizer.status());
  return VocabularyBytes(spec, spec.dim() * (1 + int64_t{(*optimizer)->num_slots()}), num_owned,
                         num_virtual_shards);
}

int64_t EmbeddingTable::reserved_bytes() const {
  return vocabulary_.size() * VocabularyRowBytes(stride_);
}

EmbeddingTable::EmbeddingTable(v1::TableSpec spec, std::unique_ptr<Optimizer> optimizer,
                               std::vector<bool> owned, int32_t num_virtual_shards,
                               int64_t stripe_capacity)
    : spec_(std::move(spec)),
      dim_(spec_.dim()),
      optimizer_(std::move(optimizer)),
      num_slots_(optimizer_->num_slots()),
      stride_((1 + int64_t{num_slots_}) * dim_),
      owned_(std::move(owned)),
      num_virtual_shards_(num_virtual_shards),
      admission_(spec_.has_admission()),
      sketch_width_(admission_ ? StripeSketchWidth(spec_.admission()) : 0),
      tracks_last_(TracksLast(spec_.eviction())),
      ttl_in_seconds_(spec_.eviction().ttl_seconds() > 0),
      eviction_(static_cast<uint32_t>(
                    std::max(spec_.eviction().ttl_steps(), spec_.eviction().ttl_seconds())),
                stripe_capacity, spec_.eviction().policy() == v1::EvictionSpec::LFU),
      stripes_(new Stripe[kNumStripes]),
      vocabulary_size_(spec_.vocabulary_size()) {
  for (int s = 0; s < kNumStripes; ++s) {
    absl::MutexLock lock(&stripes_[s].mu);
    stripes_[s].arena.Reset(stride_);
    if (admission_) {
      stripes_[s].sketch =
          AdmissionFilter(sketch_width_, static_cast<uint32_t>(spec_.admission().min_count()),
                          spec_.admission().probability());
    }
  }
  // A failed allocation leaves vocabulary_ unusable, which Create reports.
  if (vocabulary_size_ > 0) vocabulary_.Allocate(vocabulary_size_, owned_, stride_, kNumStripes);
}

EmbeddingTable::~EmbeddingTable() = default;

}  // namespace pscluster
