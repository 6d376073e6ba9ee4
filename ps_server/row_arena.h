#ifndef PSCLUSTER_PS_SERVER_ROW_ARENA_H_
#define PSCLUSTER_PS_SERVER_ROW_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pscluster {

// The rows of one embedding-table stripe: row r is `stride` floats at Row(r), for r < size().
// Rows live in blocks from HugePagePool::Default() (huge pages shared by all of a process's
// tables), rows_per_block() rows each, a power of two chosen so that a block is 32-64 KiB (or
// one row, for rows over 64 KiB). While the stripe is small its first block grows, doubling
// from 16 rows, so a table of a few rows stays a few KiB; once the first block is full size,
// rows never move again and the arena grows a block at a time with no copying. Memory is what
// the blocks take (the last one partly used), not a doubling vector's capacity.
//
// Thread-safety: none (the stripe's lock guards it); const methods may run concurrently.
class RowArena {
 public:
  RowArena() = default;
  explicit RowArena(int64_t stride) { Reset(stride); }
  RowArena(const RowArena&) = delete;
  RowArena& operator=(const RowArena&) = delete;
  ~RowArena();

  // Frees every row and sets the row length to `stride` floats. REQUIRES: stride >= 1.
  void Reset(int64_t stride);
  // Frees every row, keeping the stride.
  void Clear() { Reset(stride_); }
  // Exchanges the rows (and strides) of the two arenas; rows keep their addresses.
  void Swap(RowArena& other) noexcept;

  // Row r. Valid until the next AddRow while the stripe is smaller than one block, or Clear.
  // REQUIRES: r < size().
  float* Row(uint64_t r) { return blocks_[r >> block_shift_] + (r & block_mask_) * stride_; }
  const float* Row(uint64_t r) const {
    return blocks_[r >> block_shift_] + (r & block_mask_) * stride_;
  }

  // Rows added and not taken back.
  uint64_t size() const { return size_; }
  int64_t stride() const { return stride_; }
  uint64_t rows_per_block() const { return block_mask_ + 1; }
  // Bytes of the blocks held.
  size_t bytes_reserved() const;

  // Appends row size() with every float 0 and returns its number. Throws std::bad_alloc when
  // no memory is left, as a vector's growth does.
  uint64_t AddRow();
  // Takes back the last row added. REQUIRES: size() > 0.
  void RemoveLastRow() { --size_; }

 private:
  static constexpr uint64_t kFirstBlockRows = 16;

  size_t BlockBytes(uint64_t rows) const {
    return static_cast<size_t>(rows) * static_cast<size_t>(stride_) * sizeof(float);
  }
  void FreeBlocks();

  int64_t stride_ = 1;
  int block_shift_ = 0;
  uint64_t block_mask_ = 0;
  std::vector<float*> blocks_;
  uint64_t first_block_rows_ = 0;  // the first block's capacity, up to rows_per_block()
  uint64_t size_ = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_ROW_ARENA_H_
