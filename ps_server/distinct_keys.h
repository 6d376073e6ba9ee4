#ifndef PSCLUSTER_PS_SERVER_DISTINCT_KEYS_H_
#define PSCLUSTER_PS_SERVER_DISTINCT_KEYS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ps_server/row_index.h"

namespace pscluster {

// How an embedding table groups one lock stripe's part of a push before it touches any row:
// each distinct key once, with the sum of its gradients in order of position. Thread-compatible;
// the table keeps these per thread, so their storage lasts from push to push.

// An open-addressing map from key to the position of its first occurrence, for summing the
// duplicate keys of one stripe's part of a push. It is rebuilt for every stripe, which costs a
// flat_hash_map more (allocation, growth) than this linear-probing table that keeps its storage
// from stripe to stripe.
class FirstOccurrenceIndex {
 public:
  // Empties the index and makes room for up to max_keys keys.
  void Reset(int64_t max_keys) {
    size_t capacity = 16;
    while (capacity < 2 * static_cast<size_t>(max_keys)) capacity *= 2;
    mask_ = capacity - 1;
    slots_.assign(capacity, Slot{0, kEmpty});
  }

  // Returns the position recorded for `key`, or records and returns `position` if there is none.
  int64_t FindOrInsert(int64_t key, int64_t position) {
    // The low bits of the mix: the stripe used the top ones, so these still vary within one.
    for (size_t i = MixKey(key) & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.position == kEmpty) {
        slot = Slot{key, position};
        return position;
      }
      if (slot.key == key) return slot.position;
    }
  }

 private:
  static constexpr int64_t kEmpty = -1;
  struct Slot {
    int64_t key;
    int64_t position;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// The gradients of one stripe's distinct keys in a push, each as a pointer: to the request's own
// row for a key that occurs once, to a sum of its rows in order of position for a repeated one.
// (Repeats are few in a large random request, so most gradients are never copied.) Storage is
// kept from push to push.
class DistinctGradients {
 public:
  // Forgets the gradients listed, and makes room for up to `count` keys of `dim` floats.
  void Reset(int64_t count, int64_t dim) {
    count_ = count;
    dim_ = dim;
    num_sums_ = 0;
    // Grown, never shrunk: a resize writes only what it adds.
    if (grads_.size() < static_cast<size_t>(count)) {
      grads_.resize(static_cast<size_t>(count));
      summed_.resize(static_cast<size_t>(count));
    }
  }

  // Lists `grad` as distinct key i's gradient.
  void Set(int64_t i, const float* grad) {
    grads_[i] = grad;
    summed_[i] = 0;
  }

  // Adds `grad` to distinct key i's gradient; at the key's second occurrence, its sum starts as
  // a copy of the first.
  void Add(int64_t i, const float* grad) {
    if (!summed_[i]) {
      // At most count / 2 sums (each needs two occurrences), sized first so they never move.
      const size_t most = static_cast<size_t>((count_ / 2) * dim_);
      if (num_sums_ == 0 && sums_.size() < most) sums_.resize(most);
      float* sum = sums_.data() + num_sums_++ * dim_;
      std::memcpy(sum, grads_[i], static_cast<size_t>(dim_) * sizeof(float));
      grads_[i] = sum;
      summed_[i] = 1;
    }
    float* sum = const_cast<float*>(grads_[i]);
    for (int64_t d = 0; d < dim_; ++d) sum[d] += grad[d];
  }

  const float* operator[](int64_t i) const { return grads_[i]; }

 private:
  int64_t count_ = 0;
  int64_t dim_ = 0;
  int64_t num_sums_ = 0;
  std::vector<const float*> grads_;
  std::vector<uint8_t> summed_;  // whether grads_[i] is in sums_
  std::vector<float> sums_;
};

// A part's distinct keys, in order of first occurrence, each with its summed gradient:
// ApplyStripe's per-thread scratch, grown, never shrunk (tables of other dims share it).
struct DistinctKeys {
  FirstOccurrenceIndex first_occurrence;
  std::vector<int64_t> keys;
  DistinctGradients grads;

  // Lists the keys keys[order[0, count)] with gradients grads[order[j] * dim, + dim); how many
  // are distinct.
  int64_t List(const int64_t* all_keys, const float* all_grads, const int64_t* order, int64_t count,
               int64_t dim) {
    first_occurrence.Reset(count);
    if (keys.size() < static_cast<size_t>(count)) keys.resize(static_cast<size_t>(count));
    grads.Reset(count, dim);
    int64_t n = 0;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t pos = order[j];
      const int64_t key = all_keys[pos];
      const int64_t first = first_occurrence.FindOrInsert(key, n);
      if (first == n) {
        keys[static_cast<size_t>(n)] = key;
        grads.Set(n++, all_grads + pos * dim);
      } else {
        grads.Add(first, all_grads + pos * dim);
      }
    }
    return n;
  }
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_DISTINCT_KEYS_H_
