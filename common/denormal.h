#ifndef PSCLUSTER_COMMON_DENORMAL_H_
#define PSCLUSTER_COMMON_DENORMAL_H_

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace pscluster {

// While in scope, the calling thread treats denormal float inputs as zero and flushes denormal
// results to zero (x86 MXCSR DAZ and FTZ); the previous mode comes back at the end of the scope.
// TensorFlow runs its kernels this way (its thread pools and executor flush denormals), and so
// do our optimizer updates: on Intel cores an operation that meets a denormal takes a microcode
// assist of about a hundred cycles, and Adam's moments of rarely-seen features decay through the
// denormal range (the MLP's Adam update ran 2-5x slower per element on the GPU host than on an
// AMD machine that handles denormals in hardware). Elsewhere than x86 this is a no-op.
//
// Thread-safety: affects only the calling thread. Not copyable.
class ScopedFlushDenormals {
 public:
#if defined(__SSE__) || defined(__x86_64__)
  static constexpr unsigned kFlushToZero = 0x8000;       // MXCSR FTZ
  static constexpr unsigned kDenormalsAreZero = 0x0040;  // MXCSR DAZ
  ScopedFlushDenormals() : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero);
  }
  ~ScopedFlushDenormals() { _mm_setcsr(saved_); }
#else
  ScopedFlushDenormals() = default;
  ~ScopedFlushDenormals() = default;
#endif
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
#if defined(__SSE__) || defined(__x86_64__)
  const unsigned saved_;
#endif
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_DENORMAL_H_
