// The parameter server through the real daemons: 2 ps tasks and a chief on 127.0.0.1, with
// clients in this process.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/live_cluster.h"
#include "cli/vars_command.h"
#include "client/cluster_client.h"
#include "client/grpc_chief_client.h"
#include "client/grpc_ps_transport.h"
#include "client/parameter_client.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "ps_server/in_process_ps_transport.h"
#include "sharding/placement.h"
#include "testing/small_model.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::ModelSpec Model() {
  v1::ModelSpec model;
  CHECK(google::protobuf::TextFormat::ParseFromString(kSmallModelText, &model));
  return model;
}

std::unique_ptr<TestCluster> StartCluster(std::vector<std::string> ps_flags = {},
                                          const std::string& model_text = kSmallModelText,
                                          int num_ps = 2) {
  const std::string model_path = absl::StrCat(getenv("TEST_TMPDIR"), "/model.pbtxt");
  std::ofstream(model_path) << model_text;
  TestClusterOptions options;
  options.num_ps = num_ps;
  options.num_workers = 0;
  // w is 64 rows of 64 bytes: four partitions of 16 rows, spread over both ps tasks.
  options.flags["chief"] = {"--model_spec=" + model_path, "--max_partition_bytes=1024"};
  options.flags["ps"] = std::move(ps_flags);
  auto cluster = TestCluster::Start(options);
  CHECK(cluster.ok()) << cluster.status();
  return *std::move(cluster);
}

// What ps task p.ps_task() and the task holding its backup report of dense partition `p`, its
// values included (InspectShard).
std::pair<v1::InspectShardResponse, v1::InspectShardResponse> PrimaryAndBackup(
    ParameterClient& client, const v1::DensePartition& p) {
  v1::InspectShardRequest ask;
  ask.mutable_shard()->set_variable(p.variable());
  ask.mutable_shard()->set_partition(p.partition());
  ask.set_values_count(1 << 20);
  absl::StatusOr<v1::InspectShardResponse> primary = client.InspectShard(p.ps_task(), ask);
  ask.set_backup(true);
  ask.set_primary_ps_task(p.ps_task());
  absl::StatusOr<v1::InspectShardResponse> backup = client.InspectShard(p.backup_ps_task(), ask);
  CHECK(primary.ok() && backup.ok()) << primary.status() << " " << backup.status();
  return {*std::move(primary), *std::move(backup)};
}

// Over gRPC, or with `data_plane` over the ps tasks' tensor data plane as workers call them.
std::unique_ptr<ParameterClient> ClientFor(const v1::GetModelResponse& m, int worker,
                                           bool data_plane = false) {
  std::vector<std::string> addresses(m.ps_addresses().begin(), m.ps_addresses().end());
  ParameterClientOptions options;
  options.worker = worker;
  auto client = ParameterClient::Create(
      m.model(), m.placement(),
      data_plane ? NewPsTransport(addresses, /*tensor_wire=*/true)
                 : std::make_unique<GrpcPsTransport>(addresses, GrpcPsTransportOptions()),
      options);
  CHECK(client.ok()) << client.status();
  return *std::move(client);
}

// What client `c` pushes at iteration `i`: small exact values. Dense variables use SGD, whose
// result does not depend on the order of pushes (up to rounding); the table uses Adagrad, whose
// result does, so each client has keys of its own and a row sees one client's order.
void Gradients(int c, int i, std::vector<float>* gw, std::vector<float>* gb,
               std::vector<int64_t>* keys, std::vector<float>* grows) {
  gw->resize(64 * 16);
  for (size_t j = 0; j < gw->size(); ++j) (*gw)[j] = ((j * 7 + i * 3 + c) % 9) * 0.125f - 0.5f;
  gb->assign(16, c == 0 ? 0.25f : -0.125f);
  keys->clear();
  for (int k = 0; k < 50; ++k) keys->push_back((k * 37 + i * 11) % 3000 - 1500 + c * 100000);
  keys->push_back(keys->front());  // a duplicate key in every push
  grows->assign(keys->size() * 8, 0.0f);
  for (size_t j = 0; j < grows->size(); ++j) (*grows)[j] = ((j + i + c) % 5) * 0.25f - 0.5f;
}

TEST(PsClusterTest, TwoClientsThroughTheDaemonsMatchASingleProcess) {
  std::unique_ptr<TestCluster> cluster = StartCluster();
  v1::GetModelResponse m = ModelOf(*cluster);
  ASSERT_EQ(m.ps_addresses_size(), 2);
  ASSERT_EQ(m.placement().partitions_size(), 5);  // w: 4 partitions, b: 1
  std::set<int> ps_used;
  for (const v1::DensePartition& p : m.placement().partitions()) ps_used.insert(p.ps_task());
  ASSERT_EQ(ps_used.size(), 2u);

  constexpr int kClients = 2, kIterations = 20;
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<ParameterClient> client = ClientFor(m, c);
      std::vector<float> gw, gb, grows;
      std::vector<int64_t> keys;
      std::vector<std::vector<float>> pulled;
      std::vector<float> rows;
      for (int i = 0; i < kIterations && errors[c].ok(); ++i) {
        Gradients(c, i, &gw, &gb, &keys, &grows);
        errors[c] = client->Pull({"w", "b"}, &pulled);
        rows.resize(keys.size() * 8);
        if (errors[c].ok())
          errors[c] = client->PullRows("emb", keys.data(), keys.size(), rows.data());
        if (errors[c].ok()) errors[c] = client->Push({"w", "b"}, {gw.data(), gb.data()}, i);
        if (errors[c].ok()) {
          errors[c] = client->PushRows("emb", keys.data(), keys.size(), grows.data(), i);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e << "\n" << cluster->Logs();

  // The same pushes, one after another, in one process with one store.
  auto placement1 = ComputePlacement(Model(), 1, m.placement().options());
  ASSERT_TRUE(placement1.ok());
  auto reference = ParameterClient::Create(
      Model(), *placement1, std::make_unique<InProcessPsTransport>(1, ParameterStoreOptions()), {});
  ASSERT_TRUE(reference.ok());
  ASSERT_TRUE((*reference)->CreateAll(v1::SyncOptions()).ok());
  std::set<int64_t> all_keys;
  for (int i = 0; i < kIterations; ++i) {
    for (int c = 0; c < kClients; ++c) {
      std::vector<float> gw, gb, grows;
      std::vector<int64_t> keys;
      Gradients(c, i, &gw, &gb, &keys, &grows);
      ASSERT_TRUE((*reference)->Push({"w", "b"}, {gw.data(), gb.data()}, i).ok());
      ASSERT_TRUE((*reference)->PushRows("emb", keys.data(), keys.size(), grows.data(), i).ok());
      all_keys.insert(keys.begin(), keys.end());
    }
  }
  std::unique_ptr<ParameterClient> client = ClientFor(m, -1);
  std::vector<std::vector<float>> got, want;
  ASSERT_TRUE(client->Pull({"w", "b"}, &got).ok());
  ASSERT_TRUE((*reference)->Pull({"w", "b"}, &want).ok());
  for (int v = 0; v < 2; ++v) {
    ASSERT_EQ(got[v].size(), want[v].size());
    for (size_t j = 0; j < got[v].size(); ++j) {
      // Concurrent clients apply in another order than the reference: float rounding only.
      ASSERT_NEAR(got[v][j], want[v][j], 1e-5 * std::max(1.0f, std::abs(want[v][j])))
          << (v == 0 ? "w" : "b") << "[" << j << "]";
    }
  }
  std::vector<int64_t> keys(all_keys.begin(), all_keys.end());
  std::vector<float> got_rows(keys.size() * 8), want_rows(keys.size() * 8);
  ASSERT_TRUE(client->PullRows("emb", keys.data(), keys.size(), got_rows.data()).ok());
  ASSERT_TRUE((*reference)->PullRows("emb", keys.data(), keys.size(), want_rows.data()).ok());
  for (size_t j = 0; j < got_rows.size(); ++j) {
    ASSERT_NEAR(got_rows[j], want_rows[j], 1e-5) << "emb key " << keys[j / 8];
  }

  // Both ps tasks hold part of the table, and their stats saw the traffic.
  for (int ps = 0; ps < 2; ++ps) {
    auto list = client->ListShards(ps);
    ASSERT_TRUE(list.ok());
    bool saw_table = false;
    for (const v1::ShardStats& s : list->shards()) {
      if (s.is_table()) {
        saw_table = true;
        EXPECT_GT(s.rows(), 0);
        EXPECT_EQ(s.pushes(), kClients * kIterations);
      } else {
        EXPECT_EQ(s.pushes(), kClients * kIterations) << s.name() << "/" << s.partition();
        EXPECT_EQ(s.applied_step(), kClients * kIterations);
      }
    }
    EXPECT_TRUE(saw_table) << ps;
  }
}

// The small model with its table as a vocabulary of 5000 ids (TableSpec.vocabulary_size).
std::string VocabularyModelText() {
  std::string text = kSmallModelText;
  const std::string table = "name: \"emb\"";
  CHECK_NE(text.find(table), std::string::npos);
  text.replace(text.find(table), table.size(), "name: \"emb\" vocabulary_size: 5000");
  return text;
}

// A vocabulary table through the daemons: a client routes its ids over both ps tasks (id mod
// the virtual shards), and the rows it pulls after its pushes are, bit for bit, what one
// in-process store gives for the same requests. An id outside the vocabulary is refused by
// the ps with a message naming it and the range, changes nothing, and the ps goes on serving.
TEST(PsClusterTest, AVocabularyTableThroughTheDaemonsMatchesASingleProcess) {
  std::unique_ptr<TestCluster> cluster = StartCluster({}, VocabularyModelText());
  v1::GetModelResponse m = ModelOf(*cluster);
  ASSERT_EQ(m.model().tables(0).vocabulary_size(), 5000);
  v1::ModelSpec model;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(VocabularyModelText(), &model));
  auto placement1 = ComputePlacement(model, 1, m.placement().options());
  ASSERT_TRUE(placement1.ok());
  auto reference = ParameterClient::Create(
      model, *placement1, std::make_unique<InProcessPsTransport>(1, ParameterStoreOptions()), {});
  ASSERT_TRUE(reference.ok());
  ASSERT_TRUE((*reference)->CreateAll(v1::SyncOptions()).ok());
  std::unique_ptr<ParameterClient> client = ClientFor(m, 0);

  std::set<int64_t> all_keys;
  for (int i = 0; i < 10; ++i) {
    std::vector<int64_t> keys;
    for (int k = 0; k < 300; ++k) keys.push_back((k * 37 + i * 11) % 5000);
    keys.push_back(4999);
    keys.push_back(keys.front());  // a duplicate
    std::vector<float> rows(keys.size() * 8), want(keys.size() * 8);
    ASSERT_TRUE(client->PullRows("emb", keys.data(), keys.size(), rows.data(), i).ok());
    ASSERT_TRUE((*reference)->PullRows("emb", keys.data(), keys.size(), want.data(), i).ok());
    ASSERT_EQ(rows, want) << "iteration " << i;
    std::vector<float> grads(keys.size() * 8);
    for (size_t j = 0; j < grads.size(); ++j) grads[j] = ((j + i) % 7) * 0.25f - 0.75f;
    ASSERT_TRUE(client->PushRows("emb", keys.data(), keys.size(), grads.data(), i).ok());
    ASSERT_TRUE((*reference)->PushRows("emb", keys.data(), keys.size(), grads.data(), i).ok());
    all_keys.insert(keys.begin(), keys.end());
  }
  std::vector<int64_t> keys(all_keys.begin(), all_keys.end());
  std::vector<float> got(keys.size() * 8), want(keys.size() * 8);
  ASSERT_TRUE(client->PullRows("emb", keys.data(), keys.size(), got.data()).ok());
  ASSERT_TRUE((*reference)->PullRows("emb", keys.data(), keys.size(), want.data()).ok());
  ASSERT_EQ(got, want);
  int64_t rows_held = 0;
  for (int ps = 0; ps < 2; ++ps) {
    auto list = client->ListShards(ps);
    ASSERT_TRUE(list.ok());
    for (const v1::ShardStats& s : list->shards()) {
      if (!s.is_table()) continue;
      EXPECT_GT(s.rows(), 0) << "ps " << ps;
      rows_held += s.rows();
    }
  }
  EXPECT_EQ(rows_held, static_cast<int64_t>(keys.size()));

  // Ids outside [0, 5000): refused, nothing changes, the ps keeps serving.
  for (const int64_t bad : {int64_t{5000}, int64_t{-2}}) {
    std::vector<int64_t> bad_keys = {keys[0], bad};
    std::vector<float> grads(16, 1.0f);
    absl::Status s = client->PushRows("emb", bad_keys.data(), 2, grads.data(), 99);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("key ", bad, " at position ")));
    EXPECT_THAT(std::string(s.message()), HasSubstr("expected [0, 5000) (vocabulary_size)"));
    std::vector<float> out(16);
    s = client->PullRows("emb", bad_keys.data(), 2, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  ASSERT_TRUE(client->PullRows("emb", keys.data(), keys.size(), got.data()).ok());
  EXPECT_EQ(got, want);
}

// Issue 37's first step (docs/replication.md): with a placement of replication 2, CreateAll
// also sends each ps task the backups it holds of the other tasks' shards. Here the chief has
// created the primaries (replication 1, which is what it runs) and a client then creates the
// same model with the replicated placement, as a chief that adds backups would: the primaries
// are found as they are (where a backup lives is not part of a shard's identity), every backup
// lands on the task the placement names, starts as its primary's values, is listed only when
// asked for (so that readers of a task's own shards never mistake one), and is left out of a
// save. A bad backup entry is refused with a message naming it, changes nothing (not even the
// request's own shards), and the task goes on serving.
TEST(PsClusterTest, BackupShardsLiveApartFromATasksOwnAndStayOutOfSaves) {
  std::unique_ptr<TestCluster> cluster = StartCluster({}, kSmallModelText, /*num_ps=*/3);
  const v1::GetModelResponse m = ModelOf(*cluster);
  ASSERT_EQ(m.ps_addresses_size(), 3);
  v1::PlacementOptions options = m.placement().options();
  options.set_replication(2);
  absl::StatusOr<v1::Placement> replicated = ComputePlacement(m.model(), 3, options);
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  ASSERT_EQ(replicated->partitions_size(), m.placement().partitions_size());
  for (int i = 0; i < replicated->partitions_size(); ++i) {
    ASSERT_EQ(replicated->partitions(i).ps_task(), m.placement().partitions(i).ps_task());
  }
  ASSERT_THAT(replicated->virtual_shard_to_ps(),
              ::testing::ElementsAreArray(m.placement().virtual_shard_to_ps()));

  std::unique_ptr<ParameterClient> plain = ClientFor(m, -1);
  std::vector<int> own_before(3);
  for (int ps = 0; ps < 3; ++ps) {
    absl::StatusOr<v1::ListShardsResponse> list = plain->ListShards(ps, true);
    ASSERT_TRUE(list.ok()) << list.status();
    own_before[ps] = list->shards_size();
    for (const v1::ShardStats& s : list->shards()) EXPECT_FALSE(s.backup()) << s.name();
  }

  v1::GetModelResponse with_backups = m;
  *with_backups.mutable_placement() = *replicated;
  std::unique_ptr<ParameterClient> client = ClientFor(with_backups, -1);
  int64_t created = -1;
  ASSERT_TRUE(client->CreateAll(m.sync(), &created).ok()) << cluster->Logs();
  EXPECT_EQ(created, 0) << "the primaries were there already";
  ASSERT_TRUE(client->CreateAll(m.sync(), &created).ok()) << "a repeat is harmless";

  // Where the placement says: each dense partition on its backup task, and on each task a part
  // of the table per primary it backs up virtual shards of.
  std::set<std::tuple<int, int, std::string, int>> expected;  // task, primary, name, partition
  for (const v1::DensePartition& p : replicated->partitions()) {
    ASSERT_NE(p.backup_ps_task(), p.ps_task());
    expected.insert({p.backup_ps_task(), p.ps_task(), p.variable(), p.partition()});
  }
  for (int v = 0; v < replicated->virtual_shard_to_backup_ps_size(); ++v) {
    expected.insert(
        {replicated->virtual_shard_to_backup_ps(v), replicated->virtual_shard_to_ps(v), "emb", -1});
  }
  std::set<std::tuple<int, int, std::string, int>> listed;
  for (int ps = 0; ps < 3; ++ps) {
    absl::StatusOr<v1::ListShardsResponse> own = client->ListShards(ps);
    ASSERT_TRUE(own.ok());
    EXPECT_EQ(own->shards_size(), own_before[ps]) << "ps:" << ps << " lists backups unasked";
    absl::StatusOr<v1::ListShardsResponse> all = client->ListShards(ps, true);
    ASSERT_TRUE(all.ok());
    for (const v1::ShardStats& s : all->shards()) {
      if (!s.backup()) continue;
      EXPECT_NE(s.primary_ps_task(), ps);
      listed.insert({ps, s.primary_ps_task(), s.name(), s.is_table() ? -1 : s.partition()});
      EXPECT_EQ(s.rows(), 0) << "no table row exists before a pull";
    }
    EXPECT_EQ(all->shards_size() - own_before[ps],
              static_cast<int>(std::count_if(expected.begin(), expected.end(),
                                             [&](const auto& e) { return std::get<0>(e) == ps; })));
  }
  EXPECT_EQ(listed, expected);

  // A backup starts as its primary: the same initial values, bit for bit.
  for (const v1::DensePartition& p : replicated->partitions()) {
    const auto [primary, backup] = PrimaryAndBackup(*client, p);
    EXPECT_FALSE(primary.slice().empty());
    EXPECT_EQ(backup.slice(), primary.slice()) << p.variable() << "/" << p.partition();
    EXPECT_TRUE(backup.shard().backup());
  }

  // A save writes each task's own shards only: 5 dense partitions and a table part per task.
  int64_t bytes = 0;
  absl::StatusOr<std::vector<v1::SavedShard>> saved =
      client->SaveShards(absl::StrCat(getenv("TEST_TMPDIR"), "/backups-ckpt"), /*step=*/0, &bytes);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->size(), 5u + 3u);
  std::set<std::pair<std::string, int>> saved_dense;
  for (const v1::SavedShard& s : *saved) {
    if (!s.is_table()) EXPECT_TRUE(saved_dense.insert({s.name(), s.partition()}).second);
  }
  EXPECT_EQ(saved_dense.size(), 5u);

  // psctl vars: each task's backups beside its own shards, and, read with the replicated
  // placement (as from a chief that runs it), each partition's backup task and whether it
  // holds it.
  std::unique_ptr<ChiefClient> chief = NewGrpcChiefClient(cluster->chief_address());
  absl::StatusOr<LiveCluster> live = ConnectToCluster(*chief, LiveClusterOptions());
  ASSERT_TRUE(live.ok()) << live.status();
  absl::Status report_status;
  psctl::VarsReport report = BuildVarsReport(*live, &report_status);
  ASSERT_TRUE(report_status.ok()) << report_status;
  ASSERT_EQ(report.ps_tasks_size(), 3);
  for (const psctl::PsTaskInfo& t : report.ps_tasks()) {
    EXPECT_EQ(t.shards(), own_before[t.index()]);
    EXPECT_EQ(t.backup_shards(),
              std::count_if(expected.begin(), expected.end(),
                            [&](const auto& e) { return std::get<0>(e) == t.index(); }));
    EXPECT_GT(t.backup_bytes(), 0);
  }
  EXPECT_THAT(FormatVarsReport(report), HasSubstr("BACKUPS"));
  *live->model.mutable_placement() = *replicated;
  report = BuildVarsReport(*live, &report_status);
  ASSERT_TRUE(report_status.ok()) << report_status;
  for (const psctl::VariableInfo& v : report.variables()) {
    for (const psctl::PartitionInfo& p : v.partitions()) {
      EXPECT_TRUE(p.has_backup() && p.backup_held()) << v.name() << "/" << p.partition();
      EXPECT_NE(p.backup_ps_task(), p.ps_task());
    }
  }
  const std::string text = FormatVarsReport(report);
  EXPECT_THAT(text, HasSubstr("BACKUP"));
  EXPECT_THAT(text, HasSubstr(" (0 updates, in step)"));

  // Bad entries, each with a new shard of the task's own beside it: refused, nothing created.
  const int target = 0;
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(m.ps_addresses(target), grpc::InsecureChannelCredentials()));
  auto count_all = [&] {
    absl::StatusOr<v1::ListShardsResponse> all = client->ListShards(target, true);
    CHECK(all.ok()) << all.status();
    return all->shards_size();
  };
  const int before = count_all();
  auto create = [&](const v1::CreateShardsRequest& req) {
    grpc::ClientContext ctx;
    v1::CreateShardsResponse resp;
    return stub->CreateShards(&ctx, req, &resp);
  };
  auto with_new_shard = [&] {
    v1::CreateShardsRequest req;
    *req.mutable_sync() = m.sync();
    v1::DenseShardSpec* spec = req.add_dense();
    spec->mutable_variable()->set_name("extra");
    spec->mutable_variable()->mutable_shape()->add_dims(4);
    spec->mutable_variable()->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
    spec->mutable_partition()->set_variable("extra");
    spec->mutable_partition()->set_row_end(4);
    return req;
  };
  struct BadCase {
    std::vector<int> primaries;
    std::string message;
  };
  for (const BadCase& c : std::vector<BadCase>{
           {{-1}, "backups[0].primary_ps_task is -1; expected a ps task index >= 0"},
           {{target}, "backups[0] names ps:0, the task it was sent to"},
           {{1, 2, 1}, "backups[2] names ps:1 again; send one entry per primary task"}}) {
    v1::CreateShardsRequest req = with_new_shard();
    for (int primary : c.primaries) {
      v1::BackupShards* b = req.add_backups();
      b->set_primary_ps_task(primary);
      *b->add_dense() = req.dense(0);
    }
    grpc::Status s = create(req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
    EXPECT_EQ(count_all(), before) << c.message;
  }
  // A backup whose spec differs from the one held: ALREADY_EXISTS, naming whose backup.
  v1::CreateShardsRequest conflict;
  *conflict.mutable_sync() = m.sync();
  for (const v1::DensePartition& p : replicated->partitions()) {
    if (p.backup_ps_task() != target) continue;
    v1::BackupShards* b = conflict.add_backups();
    b->set_primary_ps_task(p.ps_task());
    v1::DenseShardSpec* spec = b->add_dense();
    for (const v1::VariableSpec& v : m.model().variables()) {
      if (v.name() == p.variable()) *spec->mutable_variable() = v;
    }
    spec->mutable_variable()->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.25f);
    *spec->mutable_partition() = p;
    break;
  }
  ASSERT_EQ(conflict.backups_size(), 1) << "ps:0 backs up no dense partition";
  grpc::Status s = create(conflict);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(s.error_message(),
              HasSubstr(absl::StrCat("the backup of ps:", conflict.backups(0).primary_ps_task(),
                                     "'s shards: variable ")));
  EXPECT_EQ(count_all(), before);
  // Inspecting a backup the task does not hold.
  v1::InspectShardRequest ask;
  ask.mutable_shard()->set_variable("b");
  ask.set_backup(true);
  ask.set_primary_ps_task(7);
  absl::StatusOr<v1::InspectShardResponse> none = client->InspectShard(target, ask);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("this ps task holds no backup of ps:7's shards"));
  // Still serving, backups and all.
  EXPECT_TRUE(client->GetStatus(target).ok());
  EXPECT_EQ(count_all(), before);
}

// Issue 37's second step: with backups created by a placement of replication 2 (and the ps
// tasks' addresses), each primary forwards the async dense updates it applies to the task that
// backs the shard up, over ParameterServer.Replicate, before it answers the worker. After two
// workers' concurrent pushes, every backup is its primary bit for bit (values of an Adam
// variable, whose result depends on the order of its updates), with the same update count.
// Over the backups' tensor data plane, or over gRPC where the ps tasks serve none.
void ExpectBackupsFollowTheirPrimaries(const std::vector<std::string>& ps_flags,
                                       const std::string& forwarded_over,
                                       bool data_plane_clients = false) {
  std::string model_text = kSmallModelText;
  const std::string sgd = "optimizer { sgd { learning_rate: 0.5 } }";
  ASSERT_NE(model_text.find(sgd), std::string::npos);
  model_text.replace(model_text.find(sgd), sgd.size(),
                     "optimizer { adam { learning_rate: 0.01 } }");
  std::unique_ptr<TestCluster> cluster = StartCluster(ps_flags, model_text, /*num_ps=*/3);
  const v1::GetModelResponse m = ModelOf(*cluster);
  v1::PlacementOptions options = m.placement().options();
  options.set_replication(2);
  absl::StatusOr<v1::Placement> replicated = ComputePlacement(m.model(), 3, options);
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  v1::GetModelResponse with_backups = m;
  *with_backups.mutable_placement() = *replicated;
  CreateShardsOptions create;
  create.ps_addresses.assign(m.ps_addresses().begin(), m.ps_addresses().end());
  ASSERT_TRUE(ClientFor(with_backups, -1)->CreateAll(m.sync(), nullptr, create).ok())
      << cluster->Logs();

  constexpr int kClients = 2, kIterations = 20;
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<ParameterClient> client = ClientFor(with_backups, c, data_plane_clients);
      std::vector<float> gw, gb, grows;
      std::vector<int64_t> keys;
      for (int i = 0; i < kIterations && errors[c].ok(); ++i) {
        Gradients(c, i, &gw, &gb, &keys, &grows);
        errors[c] = client->Push({"w", "b"}, {gw.data(), gb.data()}, i);
        if (errors[c].ok()) {
          errors[c] = client->PushRows("emb", keys.data(), keys.size(), grows.data(), i);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e << "\n" << cluster->Logs();

  std::unique_ptr<ParameterClient> client = ClientFor(with_backups, -1);
  // Every row a primary holds of the table is on one backup task, bit for bit (Adagrad's
  // values follow from its slot: the same values, the same order of updates).
  // The keys pushed by client c in its iterations [0, iterations).
  auto keys_of = [](int c, int iterations, std::set<int64_t>* out) {
    std::vector<float> gw, gb, grows;
    std::vector<int64_t> keys;
    for (int i = 0; i < iterations; ++i) {
      Gradients(c, i, &gw, &gb, &keys, &grows);
      out->insert(keys.begin(), keys.end());
    }
  };
  std::set<int64_t> in_checkpoint, after;
  for (int c = 0; c < kClients; ++c) keys_of(c, kIterations, &in_checkpoint);
  after = in_checkpoint;
  keys_of(0, kIterations + 1, &after);
  keys_of(1, kIterations + 1, &after);
  const std::vector<int64_t> pushed_keys(after.begin(), after.end());
  auto expect_table_backups = [&](const std::string& when, size_t expected_rows) {
    int64_t rows = 0;
    for (int p = 0; p < 3; ++p) {
      v1::InspectShardRequest ask;
      ask.mutable_shard()->set_variable("emb");
      ask.mutable_shard()->set_partition(-1);
      ask.mutable_keys()->Add(pushed_keys.begin(), pushed_keys.end());
      absl::StatusOr<v1::InspectShardResponse> primary = client->InspectShard(p, ask);
      ASSERT_TRUE(primary.ok()) << primary.status();
      std::map<int64_t, std::string> row_of;
      for (int j = 0; j < primary->found_keys_size(); ++j) {
        row_of[primary->found_keys(j)] = primary->found_rows().substr(j * 8 * 4, 8 * 4);
      }
      rows += static_cast<int64_t>(row_of.size());
      int64_t backed_up = 0;
      for (int q = 0; q < 3; ++q) {
        if (q == p) continue;
        ask.set_backup(true);
        ask.set_primary_ps_task(p);
        absl::StatusOr<v1::InspectShardResponse> backup = client->InspectShard(q, ask);
        ASSERT_TRUE(backup.ok()) << backup.status();
        for (int j = 0; j < backup->found_keys_size(); ++j) {
          const int64_t key = backup->found_keys(j);
          ASSERT_EQ(row_of.count(key), 1u) << when << ": ps:" << q << " backs up key " << key
                                           << " that ps:" << p << " does not hold";
          EXPECT_EQ(backup->found_rows().substr(j * 8 * 4, 8 * 4), row_of[key])
              << when << ": key " << key << " on ps:" << q << ", the backup of ps:" << p;
          ++backed_up;
        }
      }
      EXPECT_EQ(backed_up, static_cast<int64_t>(row_of.size())) << when << ": ps:" << p;
    }
    EXPECT_EQ(rows, static_cast<int64_t>(expected_rows)) << when;
  };
  expect_table_backups("after the pushes", in_checkpoint.size());
  // psctl vars, read with the replicated placement: every table part's backups, each in step
  // (every stripe group numbered for it applied), as every partition's backup.
  {
    std::unique_ptr<ChiefClient> chief = NewGrpcChiefClient(cluster->chief_address());
    absl::StatusOr<LiveCluster> live = ConnectToCluster(*chief, LiveClusterOptions());
    ASSERT_TRUE(live.ok()) << live.status();
    *live->model.mutable_placement() = *replicated;
    absl::Status listed;
    const psctl::VarsReport report = BuildVarsReport(*live, &listed);
    ASSERT_TRUE(listed.ok()) << listed;
    ASSERT_EQ(report.tables_size(), 1);
    for (const psctl::TablePart& part : report.tables(0).parts()) {
      // Three tasks: each part's virtual shards are backed up on both others.
      EXPECT_EQ(part.backups_size(), 2) << "ps:" << part.ps_task();
      for (const psctl::TableBackup& b : part.backups()) {
        EXPECT_TRUE(b.held()) << "ps:" << b.ps_task() << " for ps:" << part.ps_task();
        EXPECT_GT(b.groups_sent(), 0) << "ps:" << b.ps_task() << " for ps:" << part.ps_task();
        EXPECT_EQ(b.groups_applied(), b.groups_sent())
            << "ps:" << b.ps_task() << " for ps:" << part.ps_task();
      }
    }
    const std::string text = FormatVarsReport(report);
    EXPECT_THAT(text, HasSubstr("(in step)")) << text;
    EXPECT_THAT(text, HasSubstr(absl::StrCat(" (", kClients * kIterations, " updates, in step)")))
        << text;
    EXPECT_THAT(text, ::testing::Not(HasSubstr("behind"))) << text;
  }
  for (const v1::DensePartition& p : replicated->partitions()) {
    const auto [primary, backup] = PrimaryAndBackup(*client, p);
    const std::string name = absl::StrCat(p.variable(), "/", p.partition());
    EXPECT_EQ(primary.shard().applied_step(), kClients * kIterations) << name;
    EXPECT_EQ(backup.shard().applied_step(), kClients * kIterations) << name;
    EXPECT_EQ(backup.slice(), primary.slice()) << name;
    EXPECT_EQ(backup.shard().pushes(), kClients * kIterations) << name;
  }
  // Table forwards go over the data plane where the backups serve one.
  const bool data_plane =
      std::find(ps_flags.begin(), ps_flags.end(), "--data_plane=false") == ps_flags.end();
  for (int ps = 0; ps < 3; ++ps) {
    EXPECT_THAT(cluster->ps(ps).LogTail(200), HasSubstr(forwarded_over)) << "ps:" << ps;
    if (data_plane_clients) {
      EXPECT_THAT(cluster->ps(ps).LogTail(200),
                  HasSubstr("committed before this task applies them"))
          << "ps:" << ps;
    }
    EXPECT_THAT(cluster->ps(ps).LogTail(200),
                HasSubstr(data_plane ? "table updates to the backups over their tensor data plane"
                                     : "table updates to the backups over gRPC"))
        << "ps:" << ps;
  }

  // A restore takes every backup back to the checkpoint with its primary, so the forwards that
  // follow land on the same values (and update counts): saved, pushed past, restored, pushed.
  const std::string checkpoint = absl::StrCat(getenv("TEST_TMPDIR"), "/replicated-",
                                              data_plane_clients, ps_flags.size(), "/ckpt-1");
  std::filesystem::remove_all(checkpoint);
  int64_t bytes = 0;
  absl::StatusOr<std::vector<v1::SavedShard>> saved = client->SaveShards(checkpoint, 1, &bytes);
  ASSERT_TRUE(saved.ok()) << saved.status();
  std::map<std::string, std::string> at_save;
  for (const v1::DensePartition& p : replicated->partitions()) {
    at_save[absl::StrCat(p.variable(), "/", p.partition())] =
        PrimaryAndBackup(*client, p).first.slice();
  }
  std::unique_ptr<ParameterClient> worker = ClientFor(with_backups, 0, data_plane_clients);
  std::vector<float> gw, gb, grows;
  std::vector<int64_t> keys;
  Gradients(0, kIterations, &gw, &gb, &keys, &grows);
  ASSERT_TRUE(worker->Push({"w", "b"}, {gw.data(), gb.data()}, kIterations).ok());
  ASSERT_TRUE(worker->PushRows("emb", keys.data(), keys.size(), grows.data(), kIterations).ok());
  ASSERT_TRUE(client->RestoreShards(checkpoint, *saved, 1).ok()) << cluster->Logs();
  expect_table_backups("after the restore", in_checkpoint.size());
  for (const v1::DensePartition& p : replicated->partitions()) {
    const auto [primary, backup] = PrimaryAndBackup(*client, p);
    const std::string name = absl::StrCat(p.variable(), "/", p.partition());
    EXPECT_EQ(primary.slice(), at_save[name]) << name;
    EXPECT_EQ(backup.slice(), at_save[name]) << name << ": the backup was not restored";
    EXPECT_EQ(backup.shard().applied_step(), kClients * kIterations) << name;
  }
  Gradients(1, kIterations, &gw, &gb, &keys, &grows);
  ASSERT_TRUE(worker->Push({"w", "b"}, {gw.data(), gb.data()}, kIterations + 1).ok())
      << cluster->Logs();
  ASSERT_TRUE(
      worker->PushRows("emb", keys.data(), keys.size(), grows.data(), kIterations + 1).ok());
  std::set<int64_t> then = in_checkpoint;
  Gradients(1, kIterations, &gw, &gb, &keys, &grows);
  then.insert(keys.begin(), keys.end());
  expect_table_backups("after a push that followed the restore", then.size());
  for (const v1::DensePartition& p : replicated->partitions()) {
    const auto [primary, backup] = PrimaryAndBackup(*client, p);
    const std::string name = absl::StrCat(p.variable(), "/", p.partition());
    EXPECT_EQ(backup.slice(), primary.slice()) << name;
    EXPECT_NE(primary.slice(), at_save[name]) << name;
    EXPECT_EQ(backup.shard().applied_step(), kClients * kIterations + 1) << name;
  }
}

TEST(PsClusterTest, AsyncDensePushesReachTheirBackupsBitForBit) {
  ExpectBackupsFollowTheirPrimaries({}, "over their tensor data plane");
}

// Workers pushing over the data plane: each primary sends the gradients on to the backups while
// they arrive, and the versions once each push has its place in its shards' order, before its
// own apply (ReplicateStream, ReplicateCommit), from writer threads (which machines of fewer
// than 8 cores, such as CI's, have only when asked for: PSCLUSTER_FORWARD_WRITERS, inherited
// by the ps daemons).
TEST(PsClusterTest, AsyncDensePushesOverTheDataPlaneReachTheirBackupsWhileTheyArrive) {
  setenv("PSCLUSTER_FORWARD_WRITERS", "2", 1);
  ExpectBackupsFollowTheirPrimaries({}, "over their tensor data plane, while the pushes arrive",
                                    /*data_plane_clients=*/true);
  unsetenv("PSCLUSTER_FORWARD_WRITERS");
}

TEST(PsClusterTest, AsyncDensePushesReachTheirBackupsOverGrpcWithoutADataPlane) {
  ExpectBackupsFollowTheirPrimaries({"--data_plane=false"},
                                    "over gRPC (it has no tensor data plane)");
}

class PsBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = StartCluster({"--max_message_bytes=1048576", "--memory_budget_mb=64"});
    model_ = ModelOf(*cluster_);
    for (const v1::DensePartition& p : model_.placement().partitions()) {
      if (p.variable() == "b") b_ps_ = p.ps_task();
    }
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateChannel(model_.ps_addresses(b_ps_), grpc::InsecureChannelCredentials()));
    client_ = ClientFor(model_, 0);
  }

  std::vector<float> ReadB() {
    std::vector<std::vector<float>> v;
    CHECK(client_->Pull({"b"}, &v).ok());
    return v[0];
  }

  // Sends a PushDense stream of `header`, then `chunks`, as a client written from proto/ alone
  // would. With `cancel`, cancels the call after its last message (the answer may or may not
  // have been sent). The response lands in *response when non-null.
  grpc::Status RawPush(const v1::PushDenseHeader& header,
                       const std::vector<v1::TensorChunk>& chunks, bool cancel = false,
                       v1::PushDenseResponse* response = nullptr) {
    grpc::ClientContext ctx;
    v1::PushDenseResponse resp;
    auto writer = stub_->PushDense(&ctx, response != nullptr ? response : &resp);
    v1::PushDenseRequest request;
    *request.mutable_header() = header;
    writer->Write(request);
    for (const v1::TensorChunk& chunk : chunks) {
      *request.mutable_chunk() = chunk;
      writer->Write(request);
    }
    writer->WritesDone();
    if (cancel) ctx.TryCancel();
    return writer->Finish();
  }

  // A header naming b/0 with `count` elements.
  static v1::PushDenseHeader HeaderForB(int64_t count) {
    v1::PushDenseHeader header;
    header.add_shards()->set_variable("b");
    header.add_num_elements(count);
    return header;
  }

  // A chunk at `offset` holding `values` as float32.
  static v1::TensorChunk Chunk(const std::vector<float>& values, int64_t offset = 0) {
    v1::TensorChunk chunk;
    chunk.set_offset(offset);
    chunk.set_data(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
    return chunk;
  }

  // Pushes `values` as the gradient of b/0, `count` elements announced.
  grpc::Status PushB(const std::vector<float>& values, int64_t count,
                     v1::DataType wire = v1::DT_FLOAT32) {
    v1::PushDenseHeader header = HeaderForB(count);
    header.set_wire_dtype(wire);
    return RawPush(header, {Chunk(values)});
  }

  std::unique_ptr<TestCluster> cluster_;
  v1::GetModelResponse model_;
  int b_ps_ = 0;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  std::unique_ptr<ParameterClient> client_;
};

TEST_F(PsBadInputTest, EachBadRequestIsRefusedClearlyAndChangesNothing) {
  const std::vector<float> before = ReadB();

  grpc::Status s = PushB(std::vector<float>(15, 1.0f), 15);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("variable b/0: gradient has 15 elements, expected 16"));

  std::vector<float> nan_grad(16, 1.0f);
  nan_grad[3] = std::numeric_limits<float>::quiet_NaN();
  s = PushB(nan_grad, 16);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("variable b/0: gradient element 3 is nan"));

  s = PushB(std::vector<float>(16, 1.0f), 16, v1::DT_INT64);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("DT_INT64"));

  {
    grpc::ClientContext ctx;
    v1::PullDenseRequest req;
    req.add_shards()->set_variable("nope");
    auto reader = stub_->PullDense(&ctx, req);
    v1::TensorChunk chunk;
    while (reader->Read(&chunk)) {
    }
    s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("unknown variable nope/0"));
  }
  // Element ranges (a striped pull): one per shard, inside it; and one that is served.
  const auto pull_range = [&](int shards, std::vector<std::pair<int64_t, int64_t>> ranges,
                              std::vector<float>* values) {
    grpc::ClientContext ctx;
    v1::PullDenseRequest req;
    for (int i = 0; i < shards; ++i) req.add_shards()->set_variable("b");
    for (const auto& [begin, end] : ranges) {
      req.add_element_begin(begin);
      req.add_element_end(end);
    }
    auto reader = stub_->PullDense(&ctx, req);
    v1::TensorChunk chunk;
    while (reader->Read(&chunk)) {
      const float* f = reinterpret_cast<const float*>(chunk.data().data());
      values->insert(values->end(), f, f + chunk.data().size() / sizeof(float));
    }
    return reader->Finish();
  };
  std::vector<float> got;
  s = pull_range(2, {{0, 4}}, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("2 shards with 1 element_begin and 1 element_end"));
  s = pull_range(1, {{4, 17}}, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("asks for elements [4, 17) of variable b/0"));
  got.clear();
  s = pull_range(1, {{4, 9}}, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got, std::vector<float>(before.begin() + 4, before.begin() + 9));
  {
    grpc::ClientContext ctx;
    v1::CreateShardsRequest req;
    v1::DenseShardSpec* spec = req.add_dense();
    *spec->mutable_variable() = Model().variables(1);
    spec->mutable_variable()->mutable_shape()->set_dims(0, 32);
    spec->mutable_partition()->set_variable("b");
    spec->mutable_partition()->set_row_end(32);
    v1::CreateShardsResponse resp;
    s = stub_->CreateShards(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    EXPECT_THAT(s.error_message(), HasSubstr("already exists with shape [16]"));
    EXPECT_THAT(s.error_message(), HasSubstr("requested shape [32]"));
  }
  {
    grpc::ClientContext ctx;
    v1::PushSparseRequest req;
    req.set_table("emb");
    req.add_keys(1);
    req.set_gradients(std::string(5 * sizeof(float), '\0'));
    v1::PushSparseResponse resp;
    s = stub_->PushSparse(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("1 keys of dim 8 need 32 gradient bytes"));
    req.set_table("nope");
    grpc::ClientContext ctx2;
    s = stub_->PushSparse(&ctx2, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("unknown table nope"));
  }
  {
    // Over the ps task's 1 MiB message limit.
    grpc::ClientContext ctx;
    v1::PushSparseRequest req;
    req.set_table("emb");
    for (int k = 0; k < 40000; ++k) req.add_keys(k);
    req.set_gradients(std::string(40000 * 8 * sizeof(float), '\0'));
    v1::PushSparseResponse resp;
    s = stub_->PushSparse(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s.error_message(), HasSubstr("larger than max"));
  }

  {
    // A chunk whose offset + count overflows int64 (it crashed the ps once).
    s = RawPush(HeaderForB(16),
                {Chunk(std::vector<float>(4), std::numeric_limits<int64_t>::max())});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("does not fit variable b/0 of 16 elements"));
  }
  {
    // The same 8-element chunk twice: the count adds up to 16, but it is one chunk repeated.
    const v1::TensorChunk ones = Chunk(std::vector<float>(8, 1.0f));
    s = RawPush(HeaderForB(16), {ones, ones});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("out of order"));
  }
  {
    // A header naming b twice.
    v1::PushDenseHeader twice = HeaderForB(16);
    twice.add_shards()->set_variable("b");
    twice.add_num_elements(16);
    s = RawPush(twice, {});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("variable b/0 is named twice in one push"));
  }
  {
    // 10^12 elements: beyond this ps task's memory budget, refused before allocating.
    grpc::ClientContext ctx;
    v1::CreateShardsRequest req;
    v1::DenseShardSpec* spec = req.add_dense();
    *spec->mutable_variable() = Model().variables(1);
    spec->mutable_variable()->set_name("huge");
    spec->mutable_variable()->mutable_shape()->set_dims(0, 1000000);
    spec->mutable_variable()->mutable_shape()->add_dims(1000000);
    spec->mutable_partition()->set_variable("huge");
    spec->mutable_partition()->set_row_end(1000000);
    v1::CreateShardsResponse resp;
    s = stub_->CreateShards(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s.error_message(), HasSubstr("memory budget"));
  }
  {
    // A vocabulary table's rows are reserved when it is created: 10^9 ids of dim 8 with
    // Adagrad (68 bytes a row) on every virtual shard are past the 64 MiB budget.
    grpc::ClientContext ctx;
    v1::CreateShardsRequest req;
    v1::TableShardSpec* spec = req.add_tables();
    *spec->mutable_table() = Model().tables(0);
    spec->mutable_table()->set_name("vocab");
    spec->mutable_table()->set_vocabulary_size(1000000000);
    spec->set_num_virtual_shards(4);
    for (int v = 0; v < 4; ++v) spec->add_virtual_shards(v);
    v1::CreateShardsResponse resp;
    s = stub_->CreateShards(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s.error_message(), HasSubstr("need 68000000000 bytes"));
    EXPECT_THAT(s.error_message(), HasSubstr("memory budget"));
    grpc::ClientContext list_ctx;
    v1::ListShardsResponse list;
    ASSERT_TRUE(stub_->ListShards(&list_ctx, v1::ListShardsRequest(), &list).ok());
    for (const v1::ShardStats& shard : list.shards()) EXPECT_NE(shard.name(), "vocab");
  }

  // Nothing changed, and the daemon still serves good requests.
  EXPECT_EQ(ReadB(), before);
  std::vector<float> g(16, 1.0f);
  ASSERT_TRUE(client_->Push({"b"}, {g.data()}, 0).ok());
  std::vector<float> after = ReadB();
  for (int i = 0; i < 16; ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.5f);
  EXPECT_TRUE(AwaitServing(model_.ps_addresses(b_ps_), absl::Seconds(1)).ok());
}

// A push whose client cancels it after its last chunk may have been applied; retried with its
// id, it is applied exactly once, and the client is told which happened.
TEST_F(PsBadInputTest, ACancelledPushRetriedWithItsIdIsAppliedOnce) {
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    const std::vector<float> before = ReadB();
    v1::PushDenseHeader header = HeaderForB(16);
    header.mutable_request_id()->set_client(1234);
    header.mutable_request_id()->set_seq(seq);
    const v1::TensorChunk ones = Chunk(std::vector<float>(16, 1.0f));
    // CANCELLED or OK, depending on the race.
    RawPush(header, {ones}, /*cancel=*/true).error_code();
    v1::PushDenseResponse resp;
    grpc::Status s = RawPush(header, {ones}, /*cancel=*/false, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.accepted(), 1);
    const std::vector<float> after = ReadB();
    for (int i = 0; i < 16; ++i) ASSERT_FLOAT_EQ(after[i], before[i] - 0.5f) << "seq " << seq;
  }
}

}  // namespace
}  // namespace pscluster
