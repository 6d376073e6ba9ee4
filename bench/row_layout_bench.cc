// An experiment for the sparse push's memory layout, outside the embedding table: is a row held
// in its index entry (one random place per key) worth a rewrite of the table's storage, against
// today's index entry pointing into an arena of rows (two random places per key)? And how far
// below both is a table with no index at all, whose keys are row numbers (one random place)?
//
// The two hashed layouts hold --key_space keys in one open-addressing index of the same capacity (a
// power of two at most 3/4 full, as RowIndex), rows of --dim floats plus one Adagrad slot, and
// apply pushes of --keys distinct random keys in request order with the same pipeline as
// EmbeddingTable::ApplyStripe: the key's first line prefetched 16 keys ahead, the row updated
// 8 keys after it was found. Nothing else of the table is here (no stripes, no locks, no
// duplicate summing, no validation), so the figures are the layouts' floor, not the table's.
//
//   split:  16-byte entries {key, row, count} -> rows of (1 + 1) * dim floats in one array
//   inline: entries {key, count, pad, (1 + 1) * dim floats} (80 bytes for dim 8)
//   direct: no index: keys are ids in [0, key_space), row id at id * (1 + 1) * dim floats and
//           its count in an array beside (a vocabulary table, as a partitioned TF Variable);
//           the same keys in the same order, the row prefetched 16 keys ahead
//
// Prints ns per key for each, interleaved --trials times, and the bytes each layout holds.
//
//   bazel run -c opt //bench:row_layout_bench -- --key_space 500000 --trials 3
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gflags/gflags.h"
#include "ps_server/row_index.h"

DEFINE_int64(keys, 100000, "Distinct keys per push.");
DEFINE_int64(key_space, 500000, "Keys held by the index (one ps task's share at 2 + 2: 500,000).");
DEFINE_int32(dim, 8, "Floats per row (each row also has one slot of dim floats).");
DEFINE_int32(rounds, 30, "Timed pushes per trial.");
DEFINE_int32(trials, 3, "Interleaved trials of each layout.");

namespace pscluster {
namespace {

constexpr int64_t kKeyAhead = 16;
constexpr int64_t kRowLag = 8;
constexpr uint32_t kEmpty = 0xffffffffu;

// Adagrad on one row: accum += g^2; value -= lr * g / (sqrt(accum) + eps).
inline void Adagrad(float* values, float* accum, const float* grad, int dim) {
  for (int d = 0; d < dim; ++d) {
    accum[d] += grad[d] * grad[d];
    values[d] -= 0.1f * grad[d] / (std::sqrt(accum[d]) + 1e-7f);
  }
}

size_t Capacity(int64_t keys) {
  size_t capacity = 16;
  while (4 * static_cast<size_t>(keys) > 3 * capacity) capacity *= 2;
  return capacity;
}

// The deleter of AlignedZeros's memory.
struct Free {
  void operator()(void* p) const { std::free(p); }
};

void* AlignedZeros(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  std::memset(p, 0, bytes);
  return p;
}

// Today's layout: the index entry names a row in an arena.
class Split {
 public:
  Split(const std::vector<int64_t>& keys, int dim)
      : dim_(dim), stride_(2 * dim), mask_(Capacity(keys.size()) - 1) {
    entries_.reset(static_cast<Entry*>(AlignedZeros((mask_ + 1) * sizeof(Entry))));
    for (size_t i = 0; i <= mask_; ++i) entries_[i].row = kEmpty;
    rows_.reset(static_cast<float*>(AlignedZeros(keys.size() * stride_ * sizeof(float))));
    for (size_t r = 0; r < keys.size(); ++r) {
      size_t i = MixKey(keys[r]) & mask_;
      while (entries_[i].row != kEmpty) i = (i + 1) & mask_;
      entries_[i] = Entry{keys[r], static_cast<uint32_t>(r), 0};
    }
  }
  size_t bytes() const { return (mask_ + 1) * sizeof(Entry); }
  size_t row_bytes(size_t rows) const { return rows * stride_ * sizeof(float); }

  void Push(const int64_t* keys, int64_t n, const float* grads) {
    uint32_t ring[16];
    for (int64_t i = 0; i < n + kRowLag; ++i) {
      if (i + kKeyAhead < n) __builtin_prefetch(&entries_[MixKey(keys[i + kKeyAhead]) & mask_]);
      if (i < n) {
        size_t s = MixKey(keys[i]) & mask_;
        while (entries_[s].key != keys[i]) s = (s + 1) & mask_;
        ++entries_[s].count;
        ring[i % 16] = entries_[s].row;
        __builtin_prefetch(rows_.get() + static_cast<size_t>(entries_[s].row) * stride_);
      }
      const int64_t j = i - kRowLag;
      if (j < 0) continue;
      float* row = rows_.get() + static_cast<size_t>(ring[j % 16]) * stride_;
      Adagrad(row, row + dim_, grads + j * dim_, dim_);
    }
  }

 private:
  struct Entry {
    int64_t key;
    uint32_t row;
    uint32_t count;
  };
  const int dim_;
  const size_t stride_;
  const size_t mask_;
  std::unique_ptr<Entry[], Free> entries_;
  std::unique_ptr<float[], Free> rows_;
};

// The row in the entry: key, count and the floats in one slot.
class Inline {
 public:
  Inline(const std::vector<int64_t>& keys, int dim)
      : dim_(dim),
        // key (8) + count (4) + pad (4) + 2 * dim floats, in 16-byte steps.
        slot_bytes_((16 + 2 * dim * sizeof(float) + 15) / 16 * 16),
        mask_(Capacity(keys.size()) - 1) {
    slots_.reset(static_cast<char*>(AlignedZeros((mask_ + 1) * slot_bytes_)));
    for (size_t i = 0; i <= mask_; ++i) Count(i) = kEmpty;
    for (int64_t key : keys) {
      size_t i = MixKey(key) & mask_;
      while (Count(i) != kEmpty) i = (i + 1) & mask_;
      Key(i) = key;
      Count(i) = 0;
    }
  }
  size_t bytes() const { return (mask_ + 1) * slot_bytes_; }

  void Push(const int64_t* keys, int64_t n, const float* grads) {
    size_t ring[16];
    for (int64_t i = 0; i < n + kRowLag; ++i) {
      if (i + kKeyAhead < n) {
        const char* slot = Slot(MixKey(keys[i + kKeyAhead]) & mask_);
        __builtin_prefetch(slot);
        __builtin_prefetch(slot + slot_bytes_ - 1);
      }
      if (i < n) {
        size_t s = MixKey(keys[i]) & mask_;
        while (Key(s) != keys[i]) s = (s + 1) & mask_;
        ++Count(s);
        ring[i % 16] = s;
      }
      const int64_t j = i - kRowLag;
      if (j < 0) continue;
      float* row = Floats(ring[j % 16]);
      Adagrad(row, row + dim_, grads + j * dim_, dim_);
    }
  }

 private:
  char* Slot(size_t i) const { return slots_.get() + i * slot_bytes_; }
  int64_t& Key(size_t i) { return *reinterpret_cast<int64_t*>(Slot(i)); }
  uint32_t& Count(size_t i) { return *reinterpret_cast<uint32_t*>(Slot(i) + 8); }
  float* Floats(size_t i) { return reinterpret_cast<float*>(Slot(i) + 16); }

  const int dim_;
  const size_t slot_bytes_;
  const size_t mask_;
  std::unique_ptr<char[], Free> slots_;
};

// A vocabulary: the key is the row's number.
class Direct {
 public:
  Direct(int64_t key_space, int dim) : dim_(dim), stride_(2 * dim), key_space_(key_space) {
    rows_.reset(static_cast<float*>(AlignedZeros(key_space * stride_ * sizeof(float))));
    counts_.reset(static_cast<uint32_t*>(AlignedZeros(key_space * sizeof(uint32_t))));
  }

  size_t bytes() const { return key_space_ * (stride_ * sizeof(float) + sizeof(uint32_t)); }

  void Push(const int64_t* ids, int64_t n, const float* grads) {
    for (int64_t i = 0; i < n; ++i) {
      if (i + kKeyAhead < n) {
        __builtin_prefetch(rows_.get() + ids[i + kKeyAhead] * stride_);
        __builtin_prefetch(counts_.get() + ids[i + kKeyAhead]);
      }
      ++counts_[ids[i]];
      float* row = rows_.get() + ids[i] * stride_;
      Adagrad(row, row + dim_, grads + i * dim_, dim_);
    }
  }

 private:
  const int dim_;
  const int64_t stride_;
  const int64_t key_space_;
  std::unique_ptr<float[], Free> rows_;
  std::unique_ptr<uint32_t[], Free> counts_;
};

template <typename Layout>
double NsPerKey(Layout& layout, const std::vector<std::vector<int64_t>>& pushes,
                const std::vector<float>& grads) {
  const auto start = std::chrono::steady_clock::now();
  int64_t keys = 0;
  for (const std::vector<int64_t>& push : pushes) {
    layout.Push(push.data(), static_cast<int64_t>(push.size()), grads.data());
    keys += static_cast<int64_t>(push.size());
  }
  const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
  return took.count() / static_cast<double>(keys);
}

int Main() {
  const int dim = FLAGS_dim;
  std::mt19937_64 rng(1);
  std::vector<int64_t> space(static_cast<size_t>(FLAGS_key_space));
  for (int64_t& k : space) k = static_cast<int64_t>(rng() >> 1);
  std::vector<std::vector<int64_t>> pushes(static_cast<size_t>(FLAGS_rounds));
  std::vector<std::vector<int64_t>> id_pushes(pushes.size());  // the same keys as ids
  std::vector<int64_t> shuffled(space.size());
  for (size_t i = 0; i < shuffled.size(); ++i) shuffled[i] = static_cast<int64_t>(i);
  for (size_t p = 0; p < pushes.size(); ++p) {
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    id_pushes[p].assign(shuffled.begin(), shuffled.begin() + std::min(FLAGS_keys, FLAGS_key_space));
    for (int64_t id : id_pushes[p]) pushes[p].push_back(space[static_cast<size_t>(id)]);
  }
  std::vector<float> grads(static_cast<size_t>(FLAGS_keys * dim));
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (float& g : grads) g = uniform(rng);

  Split split(space, dim);
  Inline in_entry(space, dim);
  Direct direct(FLAGS_key_space, dim);
  std::printf(
      "keys %lld of %lld per push, dim %d; split: index %.1f MB + rows %.1f MB; "
      "inline: %.1f MB; direct: %.1f MB\n",
      static_cast<long long>(FLAGS_keys), static_cast<long long>(FLAGS_key_space), dim,
      split.bytes() / 1e6, split.row_bytes(space.size()) / 1e6, in_entry.bytes() / 1e6,
      direct.bytes() / 1e6);
  NsPerKey(split, pushes, grads);  // warm-up: page faults, caches
  NsPerKey(in_entry, pushes, grads);
  NsPerKey(direct, id_pushes, grads);
  for (int t = 0; t < FLAGS_trials; ++t) {
    const double a = NsPerKey(split, pushes, grads);
    const double b = NsPerKey(in_entry, pushes, grads);
    const double c = NsPerKey(direct, id_pushes, grads);
    std::printf("BENCH row_layout_split_%lldk %.1f ns/key\n",
                static_cast<long long>(FLAGS_key_space / 1000), a);
    std::printf("BENCH row_layout_inline_%lldk %.1f ns/key ratio=%.2f\n",
                static_cast<long long>(FLAGS_key_space / 1000), b, b / a);
    std::printf("BENCH row_layout_direct_%lldk %.1f ns/key ratio=%.2f\n",
                static_cast<long long>(FLAGS_key_space / 1000), c, c / a);
  }
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return pscluster::Main();
}
