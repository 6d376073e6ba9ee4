#include "model/data/seeded_random.h"

#include <algorithm>
#include <cmath>

#include "glog/logging.h"

namespace pscluster {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

// Uniform in (0, 1]: never 0, so its logarithm is finite.
double UniformPositive(uint64_t bits) { return static_cast<double>((bits >> 11) + 1) * 0x1.0p-53; }

double BoxMuller(uint64_t bits1, uint64_t bits2) {
  const double radius = std::sqrt(-2.0 * std::log(UniformPositive(bits1)));
  const double angle = kTwoPi * (static_cast<double>(bits2 >> 11) * 0x1.0p-53);
  return radius * std::cos(angle);
}

}  // namespace

uint64_t CombineSeeds(uint64_t a, uint64_t b) {
  return SplitMix64(SplitMix64(a) ^ (b + 0x632be59bd9b4e019ULL));
}

double UniformDouble(std::mt19937_64* rng) {
  return static_cast<double>((*rng)() >> 11) * 0x1.0p-53;
}

uint64_t UniformBelow(std::mt19937_64* rng, uint64_t n) {
  CHECK_GT(n, 0u);
  // Outputs below 2^64 mod n would make the smallest residues more likely; skip them.
  const uint64_t threshold = (0 - n) % n;
  while (true) {
    const uint64_t x = (*rng)();
    if (x >= threshold) return x % n;
  }
}

double StandardNormal(std::mt19937_64* rng) {
  const uint64_t bits1 = (*rng)();
  const uint64_t bits2 = (*rng)();
  return BoxMuller(bits1, bits2);
}

double HashedStandardNormal(uint64_t key) {
  return BoxMuller(SplitMix64(key), SplitMix64(key ^ 0xd1b54a32d192ed03ULL));
}

int64_t PowerLawRank(double u, int64_t n, double s) {
  const double top = static_cast<double>(n) + 1.0;
  double x;
  if (s == 0) {
    x = 1.0 + u * static_cast<double>(n);
  } else if (std::abs(s - 1.0) < 1e-9) {
    x = std::exp(u * std::log(top));
  } else {
    const double a = 1.0 - s;
    x = std::pow(1.0 + u * (std::pow(top, a) - 1.0), 1.0 / a);
  }
  const int64_t rank = static_cast<int64_t>(std::floor(x)) - 1;
  return std::clamp<int64_t>(rank, 0, n - 1);
}

}  // namespace pscluster
