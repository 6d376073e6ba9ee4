#ifndef PSCLUSTER_PS_SERVER_IN_PROCESS_PS_TRANSPORT_H_
#define PSCLUSTER_PS_SERVER_IN_PROCESS_PS_TRANSPORT_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_transport.h"
#include "ps_server/parameter_store.h"

namespace pscluster {

// A PsTransport over ParameterStore objects in this process: the in-process fake of the ps
// tasks, for unit tests of code that routes over them and for the single-process benchmark.
// It only marshals: requests are built as the other transports build them and carried out by
// the same ParameterStore operations, and values go through the wire encoding, so validation,
// errors and fp16/bf16 rounding are those of the network. A task can be made unavailable to
// test retries. Thread-safe.
class InProcessPsTransport : public PsTransport {
 public:
  InProcessPsTransport(int num_ps, const ParameterStoreOptions& options);

  // Task `ps`'s store (valid until RestartTask(ps)).
  ParameterStore& store(int ps) { return *Store(ps); }
  // Another transport to the same stores (with its own failure injection).
  std::unique_ptr<InProcessPsTransport> Share() const;
  // Task `ps` restarts, as a ps process that died and came back: its store is replaced by an
  // empty one, for this transport and every one shared with it. Calls under way finish on the
  // old store.
  void RestartTask(int ps);

  // The next `n` calls to task `ps` fail with UNAVAILABLE before doing anything.
  void FailNextCalls(int ps, int n);
  // Calls made to task `ps` so far (failed ones included).
  int calls(int ps) const;

  int num_ps() const override { return num_ps_; }
  absl::Status CreateShards(int ps, const v1::CreateShardsRequest& request,
                            v1::CreateShardsResponse* response) override;
  absl::Status PullDense(int ps, const std::vector<DenseSlice>& slices, v1::DataType wire_dtype,
                         int64_t step) override;
  absl::Status PushDense(int ps, const std::vector<DenseSlice>& slices, const PushMeta& meta,
                         v1::PushDenseResponse* response) override;
  absl::Status PullSparse(int ps, const std::string& table, const int64_t* keys, int64_t n,
                          int64_t dim, v1::DataType wire_dtype, int64_t step, float* out) override;
  absl::Status PushSparse(int ps, const std::string& table, const int64_t* keys, int64_t n,
                          int64_t dim, const float* grads, const PushMeta& meta,
                          v1::PushSparseResponse* response) override;
  absl::StatusOr<v1::ListShardsResponse> ListShards(int ps,
                                                    const v1::ListShardsRequest& request) override;
  absl::StatusOr<v1::InspectShardResponse> InspectShard(
      int ps, const v1::InspectShardRequest& request) override;
  absl::Status SaveShards(int ps, const v1::SaveShardsRequest& request,
                          v1::SaveShardsResponse* response) override;
  absl::Status RestoreShards(int ps, const v1::RestoreShardsRequest& request,
                             v1::RestoreShardsResponse* response) override;
  absl::StatusOr<v1::TaskStatus> GetStatus(int ps) override;

 private:
  // The stores of every transport shared with this one.
  struct Stores {
    explicit Stores(const ParameterStoreOptions& o) : options(o) {}
    const ParameterStoreOptions options;
    absl::Mutex mu;
    std::vector<std::shared_ptr<ParameterStore>> stores ABSL_GUARDED_BY(mu);
  };

  // Counts the call and returns task `ps`'s store, or UNAVAILABLE when a failure is injected.
  absl::StatusOr<std::shared_ptr<ParameterStore>> Enter(int ps);
  std::shared_ptr<ParameterStore> Store(int ps) const;

  explicit InProcessPsTransport(std::shared_ptr<Stores> stores, int num_ps);

  const std::shared_ptr<Stores> stores_;
  const int num_ps_;
  // Push buffers kept between pushes (a transport over the network keeps one per connection).
  DensePushPool pushes_;
  mutable absl::Mutex mu_;
  std::vector<int> fail_next_ ABSL_GUARDED_BY(mu_);
  std::vector<int> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_IN_PROCESS_PS_TRANSPORT_H_
