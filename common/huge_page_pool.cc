#include "common/huge_page_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define PS_POOL_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PS_POOL_UNDER_ASAN 1
#endif
#endif

namespace pscluster {
namespace {

constexpr size_t kCacheLine = 64;

size_t RoundUp(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// The smallest shift with 2^shift >= bytes. REQUIRES: bytes >= 2.
// (Unused under AddressSanitizer, which gets every block from the system allocator.)
[[maybe_unused]] int CeilLog2(size_t bytes) { return 64 - __builtin_clzll(bytes - 1); }

// `bytes` (a multiple of kSlabBytes) mapped at a kSlabBytes-aligned address and advised
// MADV_HUGEPAGE.
void* MapAligned(size_t bytes) {
  constexpr size_t kAlign = HugePagePool::kSlabBytes;
  void* raw =
      mmap(nullptr, bytes + kAlign, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kAlign);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + bytes + kAlign;
  if (end > aligned + bytes)
    munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  // Best effort: without transparent huge pages the memory is still good, on small pages.
  madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void* AlignedAlloc(size_t bytes) {
  void* p = std::aligned_alloc(kCacheLine, RoundUp(bytes == 0 ? 1 : bytes, kCacheLine));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

HugePagePool::~HugePagePool() { Trim(); }

void HugePagePool::Trim() {
  absl::MutexLock lock(&mu_);
  for (void* slab : kept_slabs_) munmap(slab, kSlabBytes);
  slab_bytes_ -= kept_slabs_.size() * kSlabBytes;
  free_bytes_ -= kept_slabs_.size() * kSlabBytes;
  kept_slabs_.clear();
}

HugePagePool& HugePagePool::Default() {
  static HugePagePool* const pool = new HugePagePool();
  return *pool;
}

bool HugePagePool::pooled() {
#ifdef PS_POOL_UNDER_ASAN
  return false;
#else
  return true;
#endif
}

void* HugePagePool::Allocate(size_t bytes) {
#ifdef PS_POOL_UNDER_ASAN
  return AlignedAlloc(bytes);
#else
  if (bytes < kMinBlock) return AlignedAlloc(bytes);
  if (bytes > kSlabBytes) {
    const size_t mapped = RoundUp(bytes, kSlabBytes);
    void* p = MapAligned(mapped);
    absl::MutexLock lock(&mu_);
    large_bytes_ += mapped;
    return p;
  }
  const size_t used = RoundUp(bytes, kMinBlock);
  const int shift = CeilLog2(used);
  absl::MutexLock lock(&mu_);
  const uintptr_t block = reinterpret_cast<uintptr_t>(AllocateBlockLocked(shift));
  // The tail past `used` goes back as buddy-aligned pieces: at offset o, the largest power of
  // two that o is a multiple of (o stays a multiple of kMinBlock and below 2^shift).
  for (size_t offset = used; offset < (size_t{1} << shift);) {
    const size_t piece = offset & (~offset + 1);
    FreeBlockLocked(block + offset, CeilLog2(piece));
    offset += piece;
  }
  return reinterpret_cast<void*>(block);
#endif
}

void HugePagePool::Free(void* p, size_t bytes) {
  if (p == nullptr) return;
#ifdef PS_POOL_UNDER_ASAN
  std::free(p);
#else
  if (bytes < kMinBlock) {
    std::free(p);
    return;
  }
  if (bytes > kSlabBytes) {
    const size_t mapped = RoundUp(bytes, kSlabBytes);
    munmap(p, mapped);
    absl::MutexLock lock(&mu_);
    large_bytes_ -= mapped;
    return;
  }
  // [p, p + used) as Allocate handed it out: the largest powers of two first, each aligned to
  // its size because the block was aligned to a power of two >= used.
  const size_t used = RoundUp(bytes, kMinBlock);
  const uintptr_t block = reinterpret_cast<uintptr_t>(p);
  absl::MutexLock lock(&mu_);
  for (size_t offset = 0; offset < used;) {
    const int shift = 63 - __builtin_clzll(used - offset);  // the largest 2^shift <= the rest
    FreeBlockLocked(block + offset, shift);
    offset += size_t{1} << shift;
  }
#endif
}

HugePagePool::Stats HugePagePool::stats() const {
  absl::MutexLock lock(&mu_);
  return Stats{slab_bytes_, free_bytes_, large_bytes_};
}

void* HugePagePool::AllocateBlockLocked(int shift) {
  if (shift == kSlabShift) {
    if (!kept_slabs_.empty()) {
      void* slab = kept_slabs_.back();
      kept_slabs_.pop_back();
      free_bytes_ -= kSlabBytes;
      return slab;
    }
    void* slab = MapAligned(kSlabBytes);
    slab_bytes_ += kSlabBytes;
    return slab;
  }
  absl::flat_hash_set<uintptr_t>& list = free_[shift - kMinShift];
  if (!list.empty()) {
    const auto it = list.begin();
    const uintptr_t block = *it;
    list.erase(it);
    free_bytes_ -= size_t{1} << shift;
    return reinterpret_cast<void*>(block);
  }
  // Split a block twice the size: the upper half waits on this size's list.
  const uintptr_t block = reinterpret_cast<uintptr_t>(AllocateBlockLocked(shift + 1));
  list.insert(block + (uintptr_t{1} << shift));
  free_bytes_ += size_t{1} << shift;
  return reinterpret_cast<void*>(block);
}

void HugePagePool::FreeBlockLocked(uintptr_t block, int shift) {
  while (shift < kSlabShift) {
    absl::flat_hash_set<uintptr_t>& list = free_[shift - kMinShift];
    const auto buddy = list.find(block ^ (uintptr_t{1} << shift));
    if (buddy == list.end()) {
      list.insert(block);
      free_bytes_ += size_t{1} << shift;
      return;
    }
    list.erase(buddy);
    free_bytes_ -= size_t{1} << shift;
    block &= ~(uintptr_t{1} << shift);
    ++shift;
  }
  // The whole slab is free again: kept for reuse, or unmapped.
  const size_t in_use = slab_bytes_ / kSlabBytes - kept_slabs_.size() - 1;
  if (kept_slabs_.size() < std::max(kMinKeptSlabs, in_use / 8)) {
    kept_slabs_.push_back(reinterpret_cast<void*>(block));
    free_bytes_ += kSlabBytes;
    return;
  }
  munmap(reinterpret_cast<void*>(block), kSlabBytes);
  slab_bytes_ -= kSlabBytes;
}

}  // namespace pscluster
