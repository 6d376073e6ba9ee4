#include "ps_server/row_arena.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/huge_page_pool.h"

namespace pscluster {
namespace {

constexpr size_t kBlockBytes = size_t{1} << 16;

}  // namespace

RowArena::~RowArena() { FreeBlocks(); }

void RowArena::Reset(int64_t stride) {
  FreeBlocks();
  stride_ = stride;
  // The most rows, a power of two, that fit in kBlockBytes; at least one.
  const size_t row_bytes = static_cast<size_t>(stride) * sizeof(float);
  uint64_t rows = 1;
  while (2 * rows * row_bytes <= kBlockBytes) rows *= 2;
  block_shift_ = __builtin_ctzll(rows);
  block_mask_ = rows - 1;
}

void RowArena::Swap(RowArena& other) noexcept {
  std::swap(stride_, other.stride_);
  std::swap(block_shift_, other.block_shift_);
  std::swap(block_mask_, other.block_mask_);
  blocks_.swap(other.blocks_);
  std::swap(first_block_rows_, other.first_block_rows_);
  std::swap(size_, other.size_);
}

void RowArena::FreeBlocks() {
  for (size_t b = 0; b < blocks_.size(); ++b) {
    HugePagePool::Default().Free(blocks_[b],
                                 BlockBytes(b == 0 ? first_block_rows_ : rows_per_block()));
  }
  blocks_.clear();
  first_block_rows_ = 0;
  size_ = 0;
}

size_t RowArena::bytes_reserved() const {
  if (blocks_.empty()) return 0;
  return BlockBytes(first_block_rows_) + (blocks_.size() - 1) * BlockBytes(rows_per_block());
}

uint64_t RowArena::AddRow() {
  const uint64_t row = size_;
  if (blocks_.empty()) {
    first_block_rows_ = std::min(kFirstBlockRows, rows_per_block());
    blocks_.push_back(
        static_cast<float*>(HugePagePool::Default().Allocate(BlockBytes(first_block_rows_))));
  } else if (row == first_block_rows_ && first_block_rows_ < rows_per_block()) {
    // The first block doubles, moving its rows.
    const uint64_t rows = std::min(2 * first_block_rows_, rows_per_block());
    float* grown = static_cast<float*>(HugePagePool::Default().Allocate(BlockBytes(rows)));
    std::memcpy(grown, blocks_[0], BlockBytes(row));
    HugePagePool::Default().Free(blocks_[0], BlockBytes(first_block_rows_));
    blocks_[0] = grown;
    first_block_rows_ = rows;
  } else if (row == blocks_.size() * rows_per_block()) {
    blocks_.push_back(
        static_cast<float*>(HugePagePool::Default().Allocate(BlockBytes(rows_per_block()))));
  }
  std::memset(Row(row), 0, static_cast<size_t>(stride_) * sizeof(float));
  ++size_;
  return row;
}

}  // namespace pscluster
