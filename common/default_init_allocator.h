#ifndef PSCLUSTER_COMMON_DEFAULT_INIT_ALLOCATOR_H_
#define PSCLUSTER_COMMON_DEFAULT_INIT_ALLOCATOR_H_

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/huge_page_pool.h"

namespace pscluster {

// An allocator that default-initializes where std::allocator value-initializes: a vector of a
// trivial type grown by resize(n) leaves the new elements unwritten instead of zero-filling
// them. For buffers that are written whole right after they grow (a checkpoint's rows read
// into memory: zero-filling hundreds of MB first costs as much as copying them in).
template <typename T, typename Base = std::allocator<T>>
class DefaultInitAllocator : public Base {
 public:
  using Traits = std::allocator_traits<Base>;
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U, typename Traits::template rebind_alloc<U>>;
  };

  using Base::Base;
  DefaultInitAllocator() = default;
  template <typename U, typename B>
  DefaultInitAllocator(const DefaultInitAllocator<U, B>& other) noexcept  // NOLINT: as Base's
      : Base(other) {}

  // No arguments: default-initialize (nothing, for a trivial type).
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    Traits::construct(static_cast<Base&>(*this), p, std::forward<Args>(args)...);
  }
};

// Floats that resize() does not zero-fill, on huge pages (HugePagePool) from 4 KiB up: the
// buffers of hundreds of MB a checkpoint's rows are read into. Touching fresh memory a 4 KiB
// page at a time costs more than the copy into it: on the 2-core development VM, writing
// 576 MB of new small pages takes 2.5 s, of reused huge pages 0.06 s.
using UninitializedFloats =
    std::vector<float, DefaultInitAllocator<float, HugePageAllocator<float>>>;

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_DEFAULT_INIT_ALLOCATOR_H_
