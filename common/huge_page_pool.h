#ifndef PSCLUSTER_COMMON_HUGE_PAGE_POOL_H_
#define PSCLUSTER_COMMON_HUGE_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace pscluster {

// Memory for embedding tables (their row blocks and row indexes), and for the buffers a
// checkpoint's rows are read into (UninitializedFloats), on 2 MiB transparent huge pages.
// Faulting memory in 4 KiB at a time is slow (about 17 us a page on the development VM), and
// a table's lookups land on random rows and index entries, so with 4 KiB pages nearly
// every key also misses the TLB (twice: index and row), and in a virtual machine each miss is a
// two-level page walk. A table's stripes each hold well under 2 MiB of a mid-sized table, so
// advising each allocation alone would leave them on small pages; the pool carves them all out
// of shared 2 MiB slabs instead.
//
// How: a buddy allocator over 2 MiB slabs, each slab mapped 2 MiB-aligned and advised
// MADV_HUGEPAGE (the kernel backs it with a huge page when transparent huge pages are "always"
// or "madvise", Debian's default; with "never" the pool still works, on small pages). A request
// of at least kMinBlock bytes is rounded up to a multiple of kMinBlock and served from the
// smallest power-of-two block that holds it, the unused tail of that block going back to the
// free lists at once. Freed blocks merge with free buddies; a slab that is wholly free again is
// kept for reuse while the kept ones stay under an eighth of the slabs in use (and at most
// kMinKeptSlabs otherwise), and unmapped beyond that, so that a table whose stripes grow in step
// does not unmap a slab and fault in (zero) a new one at every growth. Requests over one slab get a
// mapping of their own, aligned and advised the same way; requests under kMinBlock go to
// aligned_alloc. Memory is 64-byte aligned at least; a block is aligned to its power of two.
//
// Under AddressSanitizer every request goes to aligned_alloc instead, so that ASan still sees
// each allocation's bounds.
//
// Thread-safety: thread-safe (one mutex; tables allocate a block per 32-64 KiB of rows and per
// index growth, not per key).
class HugePagePool {
 public:
  static constexpr size_t kMinBlock = size_t{1} << 12;
  static constexpr size_t kSlabBytes = size_t{1} << 21;

  HugePagePool() = default;
  HugePagePool(const HugePagePool&) = delete;
  HugePagePool& operator=(const HugePagePool&) = delete;
  // Unmaps the kept slabs. REQUIRES: everything allocated has been freed.
  ~HugePagePool();

  // The process's pool, which the tables use. Never destroyed.
  static HugePagePool& Default();

  // False under AddressSanitizer, where every request goes to aligned_alloc.
  static bool pooled();

  // `bytes` of memory (bytes == 0 is served as 1). Throws std::bad_alloc when the system has
  // none, as operator new does.
  void* Allocate(size_t bytes);
  // Returns memory from Allocate(bytes), with the same `bytes`. Null is ignored.
  void Free(void* p, size_t bytes);

  // Unmaps the wholly free slabs kept for reuse.
  void Trim();

  struct Stats {
    size_t slab_bytes = 0;   // mapped for slabs, kept free ones included
    size_t free_bytes = 0;   // of which free (on the free lists or in kept slabs)
    size_t large_bytes = 0;  // mapped for requests over one slab
  };
  Stats stats() const;

  static constexpr size_t kMinKeptSlabs = 4;

 private:
  static constexpr int kMinShift = 12;
  static constexpr int kSlabShift = 21;
  static constexpr int kNumClasses = kSlabShift - kMinShift;  // 4 KiB ... 1 MiB; a slab is 2 MiB

  void* AllocateBlockLocked(int shift) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns [block, block + 2^shift), buddy-aligned, merging it with free buddies.
  void FreeBlockLocked(uintptr_t block, int shift) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  // Free blocks of 2^(kMinShift + i) bytes, by address.
  absl::flat_hash_set<uintptr_t> free_[kNumClasses] ABSL_GUARDED_BY(mu_);
  size_t slab_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t large_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<void*> kept_slabs_ ABSL_GUARDED_BY(mu_);  // wholly free, still mapped
};

// A std allocator over HugePagePool::Default(), for containers of table memory (RowIndex) and
// of checkpoint rows read (UninitializedFloats).
template <typename T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocators convert implicitly

  T* allocate(size_t n) { return static_cast<T*>(HugePagePool::Default().Allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { HugePagePool::Default().Free(p, n * sizeof(T)); }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_HUGE_PAGE_POOL_H_
