// The PsTransport conformance suite against the in-process transport.
#include "ps_server/in_process_ps_transport.h"

#include "client/parameter_client.h"
#include "client/ps_transport_conformance.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

class InProcessEnvironment : public PsTransportEnvironment {
 public:
  InProcessEnvironment() {
    ParameterStoreOptions options;
    options.max_sparse_keys = kConformanceMaxSparseKeys;
    auto transport = std::make_unique<InProcessPsTransport>(2, options);
    root_ = transport->Share();
    auto client = ParameterClient::Create(ConformanceModel(), ConformancePlacement(),
                                          std::move(transport), ParameterClientOptions());
    CHECK(client.ok()) << client.status();
    CHECK((*client)->CreateAll(v1::SyncOptions()).ok());
  }
  std::unique_ptr<PsTransport> NewTransport() override { return root_->Share(); }

 private:
  std::unique_ptr<InProcessPsTransport> root_;
};

INSTANTIATE_TEST_SUITE_P(InProcess, PsTransportConformanceTest,
                         ::testing::Values(PsTransportFactory{
                             "in_process",
                             [] { return std::make_unique<InProcessEnvironment>(); }}),
                         PsTransportFactoryName);

}  // namespace
}  // namespace pscluster
