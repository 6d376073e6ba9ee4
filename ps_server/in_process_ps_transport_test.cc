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

TEST(InProcessPsTransportTest, ARestartedTaskIsEmptyForEveryTransportSharingIt) {
  InProcessPsTransport root(2, ParameterStoreOptions());
  std::unique_ptr<InProcessPsTransport> other = root.Share();
  auto client = ParameterClient::Create(ConformanceModel(), ConformancePlacement(), root.Share(),
                                        ParameterClientOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CreateAll(v1::SyncOptions()).ok());
  ASSERT_GT(other->ListShards(0, v1::ListShardsRequest())->shards_size(), 0);
  const int on_ps1 = other->ListShards(1, v1::ListShardsRequest())->shards_size();

  root.RestartTask(0);
  EXPECT_EQ(other->ListShards(0, v1::ListShardsRequest())->shards_size(), 0);
  EXPECT_EQ(root.store(0).ListShards().shards_size(), 0);
  EXPECT_EQ(other->ListShards(1, v1::ListShardsRequest())->shards_size(), on_ps1);
  // The client's creation goes to the new store.
  ASSERT_TRUE((*client)->CreateAll(v1::SyncOptions()).ok());
  EXPECT_GT(other->ListShards(0, v1::ListShardsRequest())->shards_size(), 0);
}

INSTANTIATE_TEST_SUITE_P(InProcess, PsTransportConformanceTest,
                         ::testing::Values(PsTransportFactory{
                             "in_process",
                             [] { return std::make_unique<InProcessEnvironment>(); }}),
                         PsTransportFactoryName);

}  // namespace
}  // namespace pscluster
