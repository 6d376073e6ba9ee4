#ifndef PSCLUSTER_COMMON_HASH_H_
#define PSCLUSTER_COMMON_HASH_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace pscluster {

// The project's two portable hashes. Their values are part of what the cluster stores and
// agrees on (key placement, initial values, data ids, checkpoint fingerprints), so they are
// fixed by these definitions, never by std::hash or absl::Hash, and the same in every process,
// build and platform. Pure; thread-safe.

// splitmix64's output for state x (Steele, Lea, Flood 2014): the golden-ratio increment, then
// Stafford's variant-13 finalizer. A bijection, well mixed even for sequential inputs (raw ids
// usually are); the increment keeps 0 from mapping to 0. SplitMix64(0) == 0xe220a8397b1dcdaf.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The increment between splitmix64's successive states: a generator at state s returns
// SplitMix64(s) and moves to s + kSplitMix64Step.
constexpr uint64_t kSplitMix64Step = 0x9e3779b97f4a7c15ULL;

// 64-bit FNV-1a of `bytes`, continuing from `state` (the offset basis to start; a previous
// result to hash more bytes after those, as if concatenated).
constexpr uint64_t kFnv1a64Basis = 0xcbf29ce484222325ULL;
inline uint64_t Fnv1a64(absl::string_view bytes, uint64_t state = kFnv1a64Basis) {
  for (const char c : bytes) {
    state ^= static_cast<unsigned char>(c);
    state *= 0x100000001b3ULL;
  }
  return state;
}

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_HASH_H_
