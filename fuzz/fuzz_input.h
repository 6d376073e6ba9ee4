#ifndef PSCLUSTER_FUZZ_FUZZ_INPUT_H_
#define PSCLUSTER_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace pscluster {

// Reads typed values from the front of a fuzzer's input, in order, so that seed inputs can be
// written by hand (little-endian integers, length-prefixed strings). Past the end it gives
// zeros and empty strings. Like LLVM's FuzzedDataProvider, without needing clang's headers
// in the gcc build. Not thread-safe.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return size_ == 0; }
  size_t remaining() const { return size_; }

  // The next sizeof(T) bytes as a little-endian T (missing bytes are 0).
  template <typename T>
  T Int() {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    U u = 0;
    for (size_t i = 0; i < sizeof(T) && size_ > 0; ++i) u |= static_cast<U>(Take()) << (8 * i);
    return static_cast<T>(u);
  }

  // An integer in [lo, hi] from one byte (lo + byte % (hi - lo + 1)). REQUIRES: hi - lo < 256.
  int Small(int lo, int hi) { return lo + static_cast<int>(Int<uint8_t>() % (hi - lo + 1)); }

  bool Bool() { return (Int<uint8_t>() & 1) != 0; }

  // `n` bytes, fewer when the input ends first.
  std::string Bytes(size_t n) {
    n = n < size_ ? n : size_;
    std::string out(reinterpret_cast<const char*>(data_), n);
    data_ += n;
    size_ -= n;
    return out;
  }

  // A string of one length byte, then that many bytes.
  std::string Short() { return Bytes(Int<uint8_t>()); }

  // Everything left.
  std::string Rest() { return Bytes(size_); }

 private:
  uint8_t Take() {
    --size_;
    return *data_++;
  }

  const uint8_t* data_;
  size_t size_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_FUZZ_FUZZ_INPUT_H_
