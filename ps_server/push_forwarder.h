#ifndef PSCLUSTER_PS_SERVER_PUSH_FORWARDER_H_
#define PSCLUSTER_PS_SERVER_PUSH_FORWARDER_H_

#include <vector>

#include "absl/status/status.h"
#include "proto/ps_service.pb.h"

namespace pscluster {

// The dense updates of one push that one backup task must apply (issue 37,
// docs/replication.md): what the primary applied, in its order (ReplicateHeader.versions), and
// the gradients, owned (a forward that failed is kept for the push's retry, which outlives the
// push's buffers).
struct DenseForward {
  int backup = -1;
  v1::ReplicateHeader header;
  // grads[i]: header.push().num_elements(i) floats for header.push().shards(i).
  std::vector<std::vector<float>> grads;
};

// The forwards of one push, one per backup task.
struct ForwardList {
  std::vector<DenseForward> forwards;
};

// Sends a primary's forwards to its backups (ps_server's GrpcPushForwarder; fakes in tests).
class PushForwarder {
 public:
  virtual ~PushForwarder() = default;
  // Sends every forward to its backup task and returns once each has applied it (or had it
  // already). An error names the backup task; what the others did stands.
  virtual absl::Status Forward(const ForwardList& list) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_PUSH_FORWARDER_H_
