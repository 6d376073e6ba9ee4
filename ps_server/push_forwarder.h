#ifndef PSCLUSTER_PS_SERVER_PUSH_FORWARDER_H_
#define PSCLUSTER_PS_SERVER_PUSH_FORWARDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/ps_service.pb.h"

namespace pscluster {

// The dense updates of one push that one backup task must apply (issue 37,
// docs/replication.md): what the primary applied, in its order (ReplicateHeader.versions), and
// the gradients. As made by the store they are views of the push's own buffers, sent from
// there with no copy; a copy of a forward owns copies of them (a forward that failed is kept
// for the push's retry, which outlives the push's buffers). Moving keeps what it views.
struct DenseForward {
  DenseForward() = default;
  DenseForward(DenseForward&&) = default;
  DenseForward& operator=(DenseForward&&) = default;
  // Copies the gradients into the new forward's own memory.
  DenseForward(const DenseForward& other)
      : backup(other.backup), generation(other.generation), header(other.header) {
    owned.reserve(other.grads.size());
    for (absl::Span<const float> g : other.grads) {
      owned.emplace_back(g.begin(), g.end());
      grads.emplace_back(owned.back());
    }
  }
  DenseForward& operator=(const DenseForward& other) {
    if (this != &other) *this = DenseForward(other);
    return *this;
  }

  int backup = -1;
  // Which backup of that task (DenseShard::backup_generation): a forward made for one that was
  // lost since is not sent to the task's next one.
  int64_t generation = 0;
  v1::ReplicateHeader header;
  // grads[i]: header.push().num_elements(i) floats for header.push().shards(i).
  std::vector<absl::Span<const float>> grads;
  // What grads views in a copy.
  std::vector<std::vector<float>> owned;
};

// The forwards of one push, one per backup task.
struct ForwardList {
  std::vector<DenseForward> forwards;
};

// A forward whose gradients go to the backup while the primary is still receiving the push
// (the data plane's ReplicateStream op: docs/wire.md, docs/replication.md): Write() each piece as
// it arrives, in order, then Commit() the versions and outcome once the primary gave the push its
// place in each shard's order (before its own apply, under the shards' locks, where
// CommitQueues()), then Await() the backup's answer. Destroyed before Commit(), it abandons
// the forward: the backup applies nothing of it.
class ForwardStream {
 public:
  virtual ~ForwardStream() = default;
  // The next `n` gradient values of the stream's shards (header.push().shards, in order).
  virtual absl::Status Write(const float* values, int64_t n) = 0;
  // `header` is the whole forward's (ReplicateHeader with versions and outcome).
  virtual absl::Status Commit(const v1::ReplicateHeader& header) = 0;
  // Whether Commit() returns without waiting on the backup (it queues the commit for another
  // thread to write), so that the primary may commit under its shards' locks, before its own
  // apply. When false the primary commits after the apply.
  virtual bool CommitQueues() const { return false; }
  virtual absl::Status Await(v1::ReplicateResponse* response) = 0;
};

// Sends a primary's forwards to its backups (ps_server's RemotePushForwarder; fakes in tests).
class PushForwarder {
 public:
  virtual ~PushForwarder() = default;
  // Sends every forward to its backup task and returns once each has applied it (or had it
  // already). An error names the backup task; what the others did stands.
  virtual absl::Status Forward(const ForwardList& list) = 0;
  // A stream to task `backup` for a forward of header.push()'s shards, whose gradients total
  // `values` floats (versions and outcome come at Commit), or null where the backup cannot
  // take one now (no data plane, or not reachable): the store then forwards after the apply.
  virtual std::unique_ptr<ForwardStream> OpenStream(int backup, const v1::ReplicateHeader& header,
                                                    int64_t values) {
    return nullptr;
  }
  // A table's async push to task `backup` (ParameterServer.ReplicateSparse), once it applied it.
  virtual absl::Status ForwardSparse(int backup, const v1::ReplicateSparseRequest& request) {
    return absl::UnimplementedError("this forwarder does not forward table updates");
  }
  // A dense shard's copy to task `backup`, its new backup (ParameterServer.InstallReplica);
  // `*installed` as the backup answered (ParameterStore::InstallReplica). `*sent` (optional)
  // grows by the copy's bytes as they go out (the progress of a copy on its way).
  virtual absl::Status SendReplica(int backup, const v1::DenseReplica& replica, bool* installed,
                                   std::atomic<int64_t>* sent = nullptr) {
    return absl::UnimplementedError("this forwarder does not send copies");
  }
  // A table stripe's copy to task `backup`, its new backup (ParameterServer.InstallReplica
  // with a TableReplica): `replica` names it (its `rows` the number of keys), then the rows'
  // keys, update counts and values and slots (`stride` floats each). `*installed` as the
  // backup answered (ParameterStore::InstallTableReplica); `*sent` as for SendReplica.
  virtual absl::Status SendTableReplica(int backup, const v1::TableReplica& replica,
                                        absl::Span<const int64_t> keys,
                                        absl::Span<const int64_t> counts,
                                        absl::Span<const float> rows, bool* installed,
                                        std::atomic<int64_t>* sent = nullptr) {
    return absl::UnimplementedError("this forwarder does not send table copies");
  }
  // Ends the forwards and streams under way to task `backup` (they fail): it was counted lost
  // (ParameterStore::DropBackup), and one that hangs, frozen or cut off without a reset, would
  // hold its primary's pushes for the I/O timeout.
  virtual void AbortCalls(int backup) {}
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_PUSH_FORWARDER_H_
