// The two ends of a dense transfer inside a ps task: where a pull's values go (DensePullSink)
// and a push being received, chunk by chunk, into its gradient buffers (DensePush), which
// ParameterStore then applies.
#ifndef PSCLUSTER_PS_SERVER_DENSE_PUSH_H_
#define PSCLUSTER_PS_SERVER_DENSE_PUSH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "proto/ps_service.pb.h"
#include "ps_server/dense_shard.h"

namespace pscluster {

// Where a dense pull's values go: the transport's side of ParameterStore::PullDense.
class DensePullSink {
 public:
  virtual ~DensePullSink() = default;
  // Called once, after the request was validated and before any values, with each shard's
  // element count. An error ends the pull.
  virtual absl::Status Begin(const std::vector<int64_t>& num_elements) = 0;
  // Shard `index`'s values, the shards in order, each called under the shard's reader lock so
  // that it is one consistent update: encode or send them, do not keep the pointer.
  virtual absl::Status Values(int index, const float* values, int64_t n) = 0;
};

// One dense push being received: the gradient buffers of the shards it names, filled chunk by
// chunk, each chunk checked (bounds, order, finiteness) as it arrives. Reusable: the store's
// StartPushDense resets it and keeps its buffers, so a transport that keeps one per
// connection allocates nothing per push in the steady state. Thread-compatible.
class DensePush {
 public:
  DensePush() = default;
  DensePush(const DensePush&) = delete;
  DensePush& operator=(const DensePush&) = delete;

  int num_shards() const { return static_cast<int>(shards_.size()); }
  int64_t num_elements(int index) const { return grads_[index].size; }
  // Bytes of payload the whole push carries (every shard's elements in the wire dtype).
  int64_t payload_bytes() const { return payload_bytes_; }
  v1::DataType wire_dtype() const { return wire_; }
  int wire_bytes_per_element() const { return elem_bytes_; }
  // Shard `index`'s gradient as received so far (float32, whatever the wire dtype).
  const float* values(int index) const { return grads_[index].values(); }

  // Elements [offset, offset + bytes / element size) of shard `index`'s gradient, in the wire
  // dtype. Chunks of a shard must come in order, without gaps or overlaps. INVALID_ARGUMENT
  // naming the shard for a chunk outside the shard, out of order, not of whole elements, or
  // (unless the ps allows them) with a NaN or Inf.
  absl::Status AddChunk(int index, int64_t offset, absl::string_view bytes);

  // For a float32 wire: the transport receives `count` elements straight into Destination(),
  // then calls Received() to check them as AddChunk would.
  absl::StatusOr<float*> Destination(int index, int64_t offset, int64_t count);
  absl::Status Received(int index, int64_t offset, int64_t count);

  // In-process callers, float32: shard `index`'s whole gradient is `values` (caller memory,
  // not copied; it must stay unchanged until FinishPushDense returns). Checked as AddChunk,
  // except that NaN and Inf are looked for by FinishPushDense, on the apply pool's threads too,
  // before anything is applied.
  absl::Status UseFloats(int index, const float* values, int64_t count);

 private:
  friend class ParameterStore;
  struct Buffer {
    std::vector<float> data;  // capacity kept between pushes
    int64_t size = 0;
    int64_t received = 0;
    const float* view = nullptr;  // UseFloats: the gradient is there instead of in `data`
    bool scanned = true;          // false: not yet scanned for NaN and Inf (UseFloats)
    const float* values() const { return view != nullptr ? view : data.data(); }
  };
  absl::Status CheckChunk(int index, int64_t offset, int64_t count) const;
  absl::Status Scan(int index, int64_t offset, int64_t count, ThreadPool* pool = nullptr) const;
  // Scans the buffers UseFloats left unscanned, in order; the first error as Scan gives it.
  absl::Status ScanDeferred(ThreadPool* pool);

  v1::PushDenseHeader header_;
  std::vector<std::shared_ptr<DenseShard>> shards_;
  std::vector<Buffer> grads_;
  v1::DataType wire_ = v1::DT_FLOAT32;
  int elem_bytes_ = 4;
  int64_t payload_bytes_ = 0;
  int64_t received_bytes_ = 0;
  bool allow_non_finite_ = false;
};

// DensePush objects kept for reuse by transports that cannot keep one per connection (the gRPC
// service, the in-process transport). Thread-safe.
class DensePushPool {
 public:
  std::unique_ptr<DensePush> Take();
  void Return(std::unique_ptr<DensePush> push);

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<DensePush>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_DENSE_PUSH_H_
