#ifndef PSCLUSTER_MODEL_DATA_SEEDED_RANDOM_H_
#define PSCLUSTER_MODEL_DATA_SEEDED_RANDOM_H_

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "common/hash.h"

// Seeded pseudo-randomness that is the same on every run and every standard library.
//
// absl::BitGen is seeded from the OS and the <random> distributions and std::shuffle are
// implementation-defined, so data order and synthetic data built on them would change between
// machines. std::mt19937_64's output sequence is fixed by the standard; everything here turns
// that sequence (or a hash) into values with algorithms written out below. Normal variates go
// through std::log/std::cos/std::sqrt, which glibc computes the same way on every run.
//
// The free functions are thread-safe; a generator passed by pointer must not be shared
// between threads without external synchronization.

namespace pscluster {

// SplitMix64 (common/hash.h) derives unrelated seeds or hash keys from related values
// (seed, seed + 1).

// A seed that depends on both `a` and `b` (and on their order).
uint64_t CombineSeeds(uint64_t a, uint64_t b);

// Uniform in [0, 1), with 53 random bits: consumes exactly one output of *rng.
double UniformDouble(std::mt19937_64* rng);

// Uniform in [0, n) without modulo bias (rejection sampling; consumes one output of *rng
// except with probability < n / 2^64 per draw). REQUIRES: n > 0.
uint64_t UniformBelow(std::mt19937_64* rng, uint64_t n);

// A standard normal variate by Box-Muller; consumes exactly two outputs of *rng and keeps no
// state between calls, so the stream consumed per call is fixed.
double StandardNormal(std::mt19937_64* rng);

// A standard normal variate that is a pure function of `key` (Box-Muller over two hashes of
// it): a table of weights indexed by key without storing the table.
double HashedStandardNormal(uint64_t key);

// A popularity rank in [0, n) for a uniform `u` in [0, 1): a bounded continuous power law with
// density proportional to x^-s on [1, n + 1), floored -- closed-form inversion, O(1) time and
// memory for any n, and close to Zipf(s) for the hot ranks (s = 0 is uniform, ~1 web-like).
// REQUIRES: n >= 1, s >= 0 and finite.
int64_t PowerLawRank(double u, int64_t n, double s);

// Shuffles *values in place with the Fisher-Yates algorithm (Durstenfeld's version, from the
// back), drawing with UniformBelow. The result depends only on the input and the state of *rng.
template <typename T>
void FisherYatesShuffle(std::vector<T>* values, std::mt19937_64* rng) {
  for (size_t i = values->size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(UniformBelow(rng, i));
    using std::swap;
    swap((*values)[i - 1], (*values)[j]);
  }
}

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_SEEDED_RANDOM_H_
