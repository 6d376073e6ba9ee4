#ifndef PSCLUSTER_PS_SERVER_ADMISSION_FILTER_H_
#define PSCLUSTER_PS_SERVER_ADMISSION_FILTER_H_

#include <cstdint>
#include <vector>

namespace pscluster {

// Which keys without a row an embedding table admits (model.proto's AdmissionSpec), for one of
// its lock stripes: pushes of keys without a row are counted in a count-min sketch of kRows
// rows of 16-bit counters (four counters per key from two 32-bit halves of one hash,
// Kirsch-Mitzenmacher; conservative update: only the smallest grow, each to the key's new
// count), and a push admits its key once the count reaches min_count, or before that with
// `probability`, drawn from the key and its count. So whether a push admits depends only on the
// key and the pushes counted before, never on timing or memory layout.
//
// The keys of one request are decided on the counts as they were before it: Admit records the
// new counts as bumps, and Apply raises the counters after the request (raising to a maximum
// commutes, so the order of a request's keys does not matter).
//
// Thread-compatible: the table's stripe lock guards it.
class AdmissionFilter {
 public:
  static constexpr int kRows = 4;

  // A counter to raise, after a request's keys were decided.
  struct Bump {
    uint32_t counter;  // index in counters()
    uint16_t value;
  };

  // No counters: for a table without admission (Admit must not be called).
  AdmissionFilter() = default;
  // `width` counters per row, a power of two >= 1; min_count in [0, 65535], probability in
  // [0, 1] (the table's spec validation checks them).
  AdmissionFilter(int64_t width, uint32_t min_count, double probability);

  // Counts one push of `key`, which has no row (or an expired one), appending its new counts to
  // *bumps, and returns whether the push admits it.
  bool Admit(int64_t key, std::vector<Bump>* bumps) const;
  void Apply(const std::vector<Bump>& bumps);

  // The counters, row after row: kRows * width of them (none without admission), for
  // checkpoints.
  const std::vector<uint16_t>& counters() const { return counters_; }
  // Adds counters.size() counters (saturating) from `counters`: a restore gives a task the
  // counts of the parts whose keys it now owns.
  void Merge(const uint16_t* counters);
  void Clear();

 private:
  int64_t width_ = 0;
  uint32_t min_count_ = 0;
  double probability_ = 0;
  std::vector<uint16_t> counters_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_ADMISSION_FILTER_H_
