#ifndef PSCLUSTER_CLIENT_PS_TRANSPORT_CONFORMANCE_H_
#define PSCLUSTER_CLIENT_PS_TRANSPORT_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>

#include "client/ps_transport.h"
#include "gtest/gtest.h"
#include "proto/model.pb.h"

namespace pscluster {

// The PsTransport conformance suite: one body of tests that every transport must pass with the
// same results and the same errors (codes and messages), since the ParameterStore behind all of
// them does the work. Instantiate it with a factory of environments:
//
//   INSTANTIATE_TEST_SUITE_P(InProcess, PsTransportConformanceTest,
//                            ::testing::Values(PsTransportFactory{"in_process", &MakeEnv}),
//                            PsTransportFactoryName);

// Two ps tasks holding ConformanceModel() placed by ConformancePlacement(), shards created
// (ASYNC), each ps task refusing sparse requests of more than kConformanceMaxSparseKeys keys.
class PsTransportEnvironment {
 public:
  virtual ~PsTransportEnvironment() = default;
  // A new transport to the ps tasks (each test may make several).
  virtual std::unique_ptr<PsTransport> NewTransport() = 0;
  // Logs for failure messages.
  virtual std::string Logs() { return ""; }
};

struct PsTransportFactory {
  std::string name;
  std::function<std::unique_ptr<PsTransportEnvironment>()> make;
};

inline std::string PsTransportFactoryName(
    const ::testing::TestParamInfo<PsTransportFactory>& info) {
  return info.param.name;
}

// The model every environment holds: "w" [64, 16] (normal init, SGD 0.5) partitioned into 4
// partitions of 16 rows, "b" [16] (zeros, SGD 0.5), table "emb" of dim 8 (Adagrad 0.1).
v1::ModelSpec ConformanceModel();
// ComputePlacement(ConformanceModel(), 2, {max_partition_bytes: 1024, num_virtual_shards: 1024}).
v1::Placement ConformancePlacement();
// The ps tasks' --max_sparse_keys.
constexpr int64_t kConformanceMaxSparseKeys = 1000;

class PsTransportConformanceTest : public ::testing::TestWithParam<PsTransportFactory> {
 protected:
  void SetUp() override;
  std::unique_ptr<PsTransportEnvironment> env_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_PS_TRANSPORT_CONFORMANCE_H_
