#include "client/ps_transport.h"

#include <memory>

#include "common/row_length.h"

namespace pscluster {
namespace {

// A buffer kept by a thread from call to call: grown, never shrunk, never zeroed (fresh memory
// would be pages to fault in, or lines to miss on, at every call).
template <typename T>
T* ThreadBuffer(std::unique_ptr<T[]>* buffer, int64_t* size, int64_t n) {
  if (*size < n) {
    buffer->reset(new T[static_cast<size_t>(n)]);  // not value-initialized
    *size = n;
  }
  return buffer->get();
}

}  // namespace

absl::Status PsTransport::PushSparseGather(int ps, const std::string& table, const int64_t* keys,
                                           const int64_t* positions, int64_t n, int64_t dim,
                                           const float* grads, const PushMeta& meta,
                                           v1::PushSparseResponse* response) {
  thread_local std::unique_ptr<int64_t[]> key_buffer;
  thread_local std::unique_ptr<float[]> row_buffer;
  thread_local int64_t key_size = 0, row_size = 0;
  int64_t* const part_keys = ThreadBuffer(&key_buffer, &key_size, n);
  float* const part_grads = ThreadBuffer(&row_buffer, &row_size, n * dim);
  GatherKeys(keys, positions, n, part_keys);
  GatherRows(grads, positions, n, dim, part_grads);
  return PushSparse(ps, table, part_keys, n, dim, part_grads, meta, response);
}

}  // namespace pscluster
