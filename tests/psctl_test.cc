// psctl against the real daemons (a chief and 2 ps tasks on 127.0.0.1), both through the
// command libraries in this process and through the psctl binary, and against checkpoints
// the chief writes.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "cli/live_cluster.h"
#include "cli/npy_reader.h"
#include "cli/psctl_report.pb.h"
#include "cli/shard_command.h"
#include "cli/status_command.h"
#include "cli/vars_command.h"
#include "client/grpc_chief_client.h"
#include "client/grpc_ps_transport.h"
#include "client/parameter_client.h"
#include "common/cluster_spec.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "rocksdb/db.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kModel[] = R"pb(
  variables {
    name: "layer/kernel"
    shape { dims: 64 dims: 16 }
    initializer { kind: NORMAL stddev: 0.1 seed: 3 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  variables {
    name: "b"
    shape { dims: 16 }
    optimizer { momentum { learning_rate: 0.5 momentum: 0.9 } }
  }
  tables {
    name: "emb"
    dim: 8
    initializer { kind: UNIFORM min: -0.5 max: 0.5 seed: 9 }
    optimizer { adagrad { learning_rate: 0.1 } }
  }
)pb";

std::string TmpDir() { return getenv("TEST_TMPDIR"); }

// A cluster of a chief and 2 ps tasks serving kModel; layer/kernel is 64 rows of 64 bytes, in
// four partitions of 16 rows over both ps tasks.
std::unique_ptr<TestCluster> StartCluster(const std::string& checkpoint_dir) {
  const std::string model_path = TmpDir() + "/model.pbtxt";
  std::ofstream(model_path) << kModel;
  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = 0;
  options.flags["chief"] = {"--model_spec=" + model_path, "--max_partition_bytes=1024",
                            "--checkpoint_dir=" + checkpoint_dir, "--checkpoint_every_secs=0"};
  auto cluster = TestCluster::Start(options);
  CHECK(cluster.ok()) << cluster.status();
  return *std::move(cluster);
}

std::unique_ptr<ParameterClient> ClientFor(const v1::GetModelResponse& m) {
  std::vector<std::string> addresses(m.ps_addresses().begin(), m.ps_addresses().end());
  auto client = ParameterClient::Create(
      m.model(), m.placement(),
      std::make_unique<GrpcPsTransport>(addresses, GrpcPsTransportOptions()),
      ParameterClientOptions());
  CHECK(client.ok()) << client.status();
  return *std::move(client);
}

LiveCluster Connect(const std::string& chief_address) {
  auto chief = NewGrpcChiefClient(chief_address);
  auto live = ConnectToCluster(*chief, LiveClusterOptions());
  CHECK(live.ok()) << live.status();
  return *std::move(live);
}

struct RunResult {
  int exit_code = -1;  // -1: did not exit normally
  std::string out;
  std::string err;
};

std::string Quote(const std::string& s) {
  return "'" + absl::StrReplaceAll(s, {{"'", "'\\''"}}) + "'";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Runs the psctl binary to completion, with stdout and stderr kept apart.
RunResult Psctl(const std::vector<std::string>& args) {
  static int n = 0;
  const std::string base = absl::StrCat(TmpDir(), "/psctl-run", n++);
  std::string command = "exec " + Quote(RunfilePath("cli/psctl"));
  for (const std::string& a : args) command += " " + Quote(a);
  command += " >" + Quote(base + ".out") + " 2>" + Quote(base + ".err");
  RunResult r;
  r.exit_code = RunShellCommand(command, base + ".log").exit_code;
  r.out = ReadFile(base + ".out");
  r.err = ReadFile(base + ".err");
  return r;
}

template <typename Message>
Message ParseJson(const std::string& json) {
  Message m;
  auto s = google::protobuf::util::JsonStringToMessage(json, &m);
  CHECK(s.ok()) << s.ToString() << "\n" << json;
  return m;
}

// Statistics of values[begin, end) as the issue defines them, computed here.
struct Stats {
  int64_t count = 0;
  double min = 0, max = 0, mean = 0, std = 0, l2 = 0;
};

Stats StatsOf(const std::vector<float>& v, size_t begin, size_t end) {
  Stats s;
  double sum = 0, sq = 0;
  s.min = v[begin];
  s.max = v[begin];
  for (size_t i = begin; i < end; ++i) {
    sum += v[i];
    sq += static_cast<double>(v[i]) * v[i];
    s.min = std::min<double>(s.min, v[i]);
    s.max = std::max<double>(s.max, v[i]);
  }
  s.count = static_cast<int64_t>(end - begin);
  s.mean = sum / s.count;
  s.std = std::sqrt(std::max(0.0, sq / s.count - s.mean * s.mean));
  s.l2 = std::sqrt(sq);
  return s;
}

void ExpectStatsEqual(const v1::ValueStats& got, const Stats& want, const std::string& what) {
  EXPECT_EQ(got.count(), want.count) << what;
  EXPECT_DOUBLE_EQ(got.min(), want.min) << what;
  EXPECT_DOUBLE_EQ(got.max(), want.max) << what;
  EXPECT_NEAR(got.mean(), want.mean, 1e-12 * std::max(1.0, std::abs(want.mean))) << what;
  EXPECT_NEAR(got.std(), want.std, 1e-9) << what;
  EXPECT_NEAR(got.l2_norm(), want.l2, 1e-9 * std::max(1.0, want.l2)) << what;
  EXPECT_EQ(got.nan_count(), 0) << what;
  EXPECT_EQ(got.inf_count(), 0) << what;
}

// Keys pushed by the fixture; kUntouchedKey never is.
std::vector<int64_t> PushedKeys() { return {3, 17, -40, 1000003, 77}; }
constexpr int64_t kUntouchedKey = 424242;

// One cluster for the read-only tests, with gradients pushed through ParameterClient.
class PsctlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    checkpoint_dir_ = new std::string(TmpDir() + "/checkpoints");
    cluster_ = StartCluster(*checkpoint_dir_).release();
    model_ = new v1::GetModelResponse(ModelOf(*cluster_));
    std::unique_ptr<ParameterClient> client = ClientFor(*model_);
    std::vector<float> gw(64 * 16), gb(16);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < gw.size(); ++i) gw[i] = std::sin(0.37 * i + step) * 0.25f;
      for (size_t i = 0; i < gb.size(); ++i) gb[i] = 0.125f * (i % 5) - 0.25f;
      CHECK(client->Push({"layer/kernel", "b"}, {gw.data(), gb.data()}, step).ok());
      const std::vector<int64_t> keys = PushedKeys();
      std::vector<float> rows(keys.size() * 8);
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.5f - 0.0625f * (i % 17);
      CHECK(client->PushRows("emb", keys.data(), keys.size(), rows.data(), step).ok());
    }
  }

  static void TearDownTestSuite() {
    delete cluster_;
    delete model_;
    delete checkpoint_dir_;
  }

  std::vector<float> Pull(const std::string& variable) {
    std::vector<std::vector<float>> values;
    CHECK(ClientFor(*model_)->Pull({variable}, &values).ok());
    return values[0];
  }

  // The table's rows on each ps task, and whether `key` has a row, asked without creating one.
  int64_t TableRows() {
    auto client = ClientFor(*model_);
    int64_t rows = 0;
    for (int ps = 0; ps < 2; ++ps) {
      auto list = client->ListShards(ps);
      CHECK(list.ok());
      for (const v1::ShardStats& s : list->shards()) rows += s.is_table() ? s.rows() : 0;
    }
    return rows;
  }
  bool HasRow(int64_t key) {
    auto client = ClientFor(*model_);
    for (int ps = 0; ps < 2; ++ps) {
      v1::InspectShardRequest req;
      req.mutable_shard()->set_variable("emb");
      req.mutable_shard()->set_partition(-1);
      req.add_keys(key);
      auto r = client->InspectShard(ps, req);
      CHECK(r.ok());
      if (r->found_keys_size() > 0) return true;
    }
    return false;
  }

  std::string chief() { return "--chief=" + cluster_->chief_address(); }

  static std::string* checkpoint_dir_;
  static TestCluster* cluster_;
  static v1::GetModelResponse* model_;
};

std::string* PsctlTest::checkpoint_dir_ = nullptr;
TestCluster* PsctlTest::cluster_ = nullptr;
v1::GetModelResponse* PsctlTest::model_ = nullptr;

// The placement psctl prints must be the one the daemons use: the chief's, and each partition
// is held by the ps task it names.
void ExpectPlacementOfDaemons(const psctl::VarsReport& report, const v1::GetModelResponse& m) {
  std::map<std::pair<std::string, int>, const v1::DensePartition*> want;
  for (const v1::DensePartition& p : m.placement().partitions()) {
    want[{p.variable(), p.partition()}] = &p;
  }
  size_t seen = 0;
  for (const psctl::VariableInfo& v : report.variables()) {
    for (const psctl::PartitionInfo& p : v.partitions()) {
      auto it = want.find({v.name(), p.partition()});
      ASSERT_NE(it, want.end()) << v.name() << "/" << p.partition();
      EXPECT_EQ(p.ps_task(), it->second->ps_task()) << v.name() << "/" << p.partition();
      EXPECT_EQ(p.row_begin(), it->second->row_begin());
      EXPECT_EQ(p.row_end(), it->second->row_end());
      EXPECT_EQ(p.ps_address(), m.ps_addresses(p.ps_task()));
      EXPECT_TRUE(p.held()) << v.name() << "/" << p.partition() << " is not on ps:" << p.ps_task();
      ++seen;
    }
  }
  EXPECT_EQ(seen, want.size());
  EXPECT_EQ(report.placement_version(), m.placement().version());
}

TEST_F(PsctlTest, VarsPrintsThePlacementTheDaemonsUse) {
  LiveCluster live = Connect(cluster_->chief_address());
  CommandOutput out = RunVarsCommand(live, OutputFormat::kJson);
  ASSERT_TRUE(out.status.ok()) << out.status;
  psctl::VarsReport report = ParseJson<psctl::VarsReport>(out.text);
  ExpectPlacementOfDaemons(report, *model_);
  ASSERT_EQ(report.variables_size(), 2);
  EXPECT_EQ(report.variables(0).name(), "layer/kernel");
  EXPECT_THAT(report.variables(0).shape(), ::testing::ElementsAre(64, 16));
  EXPECT_EQ(report.variables(0).dtype(), "float32");
  EXPECT_EQ(report.variables(0).partitions_size(), 4);
  EXPECT_EQ(report.variables(0).bytes(), 64 * 16 * 4);  // SGD: no slots
  EXPECT_EQ(report.variables(1).bytes(), 16 * 4 * 2);   // values and momentum
  EXPECT_EQ(report.variables(1).optimizer(), "momentum(learning_rate=0.5, momentum=0.9)");
  ASSERT_EQ(report.tables_size(), 1);
  EXPECT_EQ(report.tables(0).rows(), static_cast<int64_t>(PushedKeys().size()));

  // The same through the binary, with the cluster spec given as TF_CONFIG JSON.
  v1::ClusterConfig config;
  *config.mutable_cluster() = cluster_->spec();
  *config.mutable_task() = MakeTaskId("chief", 0);
  RunResult r = Psctl({"--cluster=" + ToTfConfigJson(config), "--json", "vars"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectPlacementOfDaemons(ParseJson<psctl::VarsReport>(r.out), *model_);

  r = Psctl({chief(), "vars"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("layer/kernel/3"));
  EXPECT_THAT(r.out, HasSubstr("sgd(learning_rate=0.5)"));
  EXPECT_THAT(r.out, HasSubstr("adagrad(learning_rate=0.1)"));
}

TEST_F(PsctlTest, ShardStatisticsEqualThoseOfThePulledValues) {
  const std::vector<float> kernel = Pull("layer/kernel");
  LiveCluster live = Connect(cluster_->chief_address());
  ShardOptions options;
  options.format = OutputFormat::kJson;
  CommandOutput out = RunShardCommand(live, "layer/kernel", options);
  ASSERT_TRUE(out.status.ok()) << out.status;
  psctl::ShardReport report = ParseJson<psctl::ShardReport>(out.text);
  ASSERT_EQ(report.shards_size(), 4);
  for (const psctl::ShardInfo& s : report.shards()) {
    ExpectStatsEqual(s.stats(), StatsOf(kernel, s.row_begin() * 16, s.row_end() * 16),
                     absl::StrCat("layer/kernel/", s.partition()));
    EXPECT_EQ(s.updates(), 3);
  }
  const Stats all = StatsOf(kernel, 0, kernel.size());
  EXPECT_EQ(report.total().count(), all.count);
  EXPECT_NEAR(report.total().mean(), all.mean, 1e-9);
  EXPECT_NEAR(report.total().std(), all.std, 1e-9);
  EXPECT_NEAR(report.total().l2_norm(), all.l2, 1e-9);

  // One partition with a slice of its values, through the binary.
  RunResult r =
      Psctl({chief(), "--json", "--values", "--offset=5", "--count=7", "shard", "layer/kernel/2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  report = ParseJson<psctl::ShardReport>(r.out);
  ASSERT_EQ(report.shards_size(), 1);
  const psctl::ShardInfo& s = report.shards(0);
  EXPECT_EQ(s.row_begin(), 32);
  ExpectStatsEqual(s.stats(), StatsOf(kernel, 32 * 16, 48 * 16), "layer/kernel/2");
  ASSERT_EQ(s.values_size(), 7);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(s.values(i), kernel[32 * 16 + 5 + i]) << i;

  r = Psctl({chief(), "shard", "b"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("b/0"));
  EXPECT_THAT(r.out, HasSubstr("momentum"));
}

TEST_F(PsctlTest, KeyPrintsOneRowAndCreatesNone) {
  const int64_t rows_before = TableRows();
  ASSERT_FALSE(HasRow(kUntouchedKey));
  const int64_t key = PushedKeys()[1];
  std::vector<float> want(8);
  ASSERT_TRUE(ClientFor(*model_)->PullRows("emb", &key, 1, want.data()).ok());

  RunResult r = Psctl({chief(), "--json", "--key=" + std::to_string(key), "table", "emb"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  psctl::TableReport report = ParseJson<psctl::TableReport>(r.out);
  ASSERT_EQ(report.rows_size(), 1);
  EXPECT_EQ(report.rows(0).key(), key);
  ASSERT_EQ(report.rows(0).values_size(), 8);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(report.rows(0).values(j), want[j]);
  EXPECT_EQ(report.table().rows(), rows_before);
  EXPECT_EQ(report.table().parts_size(), 2);
  EXPECT_GT(report.hot_keys_size(), 0);
  // The table neither admits nor evicts: every row it holds was created, none removed.
  int64_t admitted = 0, removed = 0;
  for (const psctl::TablePart& part : report.table().parts()) {
    admitted += part.admitted_rows();
    removed += part.evicted_rows() + part.expired_rows() + part.unadmitted_keys();
  }
  EXPECT_EQ(admitted, rows_before);
  EXPECT_EQ(removed, 0);

  r = Psctl({chief(), "--key=" + std::to_string(key), "table", "emb"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("key ", key, " (ps:")));
  EXPECT_THAT(r.out, HasSubstr("RESIDENT"));
  EXPECT_THAT(r.out, HasSubstr("NOT ADMITTED"));

  // A key without a row: reported, and still without one afterwards.
  r = Psctl({chief(), "--key=" + std::to_string(kUntouchedKey), "table", "emb"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("key ", kUntouchedKey, ": no row")));
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("no row for key ", kUntouchedKey)));
  EXPECT_FALSE(HasRow(kUntouchedKey));
  EXPECT_EQ(TableRows(), rows_before);
}

TEST_F(PsctlTest, DumpWritesTheVariableAsNpy) {
  const std::vector<float> kernel = Pull("layer/kernel");
  const std::string npy = TmpDir() + "/kernel.npy";
  RunResult r = Psctl({chief(), "--out=" + npy, "dump", "layer/kernel"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto array = ReadNpyFile(npy);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ::testing::ElementsAre(64, 16));
  EXPECT_EQ(array->values, kernel);
  EXPECT_EQ(array->data_offset % 64, 0u);

  // --all: one file per dense variable and index.json.
  const std::string dir = TmpDir() + "/export";
  r = Psctl({chief(), "--all", "--out=" + dir, "dump"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tables not dumped: emb"));
  google::protobuf::Struct index =
      ParseJson<google::protobuf::Struct>(ReadFile(dir + "/index.json"));
  ASSERT_EQ(index.fields().size(), 2u);
  const std::string file =
      index.fields().at("layer/kernel").struct_value().fields().at("file").string_value();
  auto exported = ReadNpyFile(dir + "/" + file);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->values, kernel);
  auto b = ReadNpyFile(dir + "/b.npy");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->values, Pull("b"));
}

TEST_F(PsctlTest, UnknownNamesFailWithAMessageNamingThem) {
  LiveCluster live = Connect(cluster_->chief_address());
  CommandOutput out = RunShardCommand(live, "nope", ShardOptions());
  EXPECT_EQ(out.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(out.status.message()), HasSubstr("unknown variable \"nope\""));

  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{chief(), "shard", "nope"}, "unknown variable \"nope\""},
      {{chief(), "shard", "layer/kernel/9"}, "has partitions 0..3, not 9"},
      {{chief(), "--out=" + TmpDir() + "/nope.npy", "dump", "nope"}, "unknown variable \"nope\""},
      {{chief(), "table", "nope"}, "unknown table \"nope\""},
  };
  for (const auto& [args, message] : cases) {
    RunResult r = Psctl(args);
    EXPECT_EQ(r.exit_code, 1) << args.back();
    EXPECT_THAT(r.err, HasSubstr(message));
  }
  EXPECT_FALSE(std::filesystem::exists(TmpDir() + "/nope.npy"));
  RunResult r = Psctl({chief(), "frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown command \"frobnicate\""));
}

TEST_F(PsctlTest, StatusShowsPushRatesOfTheTasks) {
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    auto client = ClientFor(*model_);
    std::vector<float> gb(16, 0.0f);
    for (int step = 0; !stop; ++step) {
      CHECK(client->Push({"b"}, {gb.data()}, step).ok());
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  auto chief_client = NewGrpcChiefClient(cluster_->chief_address());
  StatusOptions options;
  options.rate_window = absl::Milliseconds(500);
  options.format = OutputFormat::kJson;
  CommandOutput out = RunStatusCommand(*chief_client, options);
  stop = true;
  pusher.join();
  ASSERT_TRUE(out.status.ok()) << out.status;
  v1::ClusterStatus status = ParseJson<v1::ClusterStatus>(out.text);
  int b_ps = -1;
  for (const v1::DensePartition& p : model_->placement().partitions()) {
    if (p.variable() == "b") b_ps = p.ps_task();
  }
  bool saw = false;
  for (const v1::TaskStatus& t : status.tasks()) {
    if (t.task().job() == "ps" && t.task().index() == b_ps) {
      saw = true;
      EXPECT_GT(t.pushes_per_second(), 10) << t.ShortDebugString();
    }
  }
  EXPECT_TRUE(saw) << out.text;

  RunResult r = Psctl({chief(), "--rate_window_secs=0.2", "status"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("PUSH/S"));
  EXPECT_THAT(r.out, HasSubstr("global step:"));
  EXPECT_THAT(r.out, HasSubstr("state: all tasks serving"));
  // No workers: the chief serves the model and has nothing to train.
  EXPECT_THAT(r.out, HasSubstr("chief phase: model_ready, for "));
}

// The chief takes a checkpoint on request; psctl lists, shows, verifies and dumps it offline,
// and finds a corrupted shard.
TEST_F(PsctlTest, SaveThenReadTheCheckpointOffline) {
  RunResult r = Psctl({chief(), "--json", "save"});
  ASSERT_EQ(r.exit_code, 0) << r.err << "\n" << cluster_->Logs();
  v1::CheckpointResponse saved = ParseJson<v1::CheckpointResponse>(r.out);
  const std::vector<float> kernel = Pull("layer/kernel");  // no push since the save
  EXPECT_THAT(saved.path(), HasSubstr(*checkpoint_dir_));

  r = Psctl({"--json", "ckpt", "list", *checkpoint_dir_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  psctl::CheckpointListReport list = ParseJson<psctl::CheckpointListReport>(r.out);
  ASSERT_GE(list.checkpoints_size(), 1);
  EXPECT_EQ(list.checkpoints(0).path(), saved.path());
  EXPECT_EQ(list.checkpoints(0).step(), saved.step());
  EXPECT_EQ(list.checkpoints(0).num_ps(), 2);

  r = Psctl({"--json", "ckpt", "show", saved.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  psctl::CheckpointShowReport show = ParseJson<psctl::CheckpointShowReport>(r.out);
  EXPECT_EQ(show.manifest().step(), saved.step());
  EXPECT_EQ(show.manifest().placement().version(), model_->placement().version());
  r = Psctl({"ckpt", "show", saved.path()});
  EXPECT_THAT(r.out, HasSubstr("layer/kernel/3"));

  r = Psctl({"ckpt", "verify", *checkpoint_dir_});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr(" 0 failed"));

  const std::string npy = TmpDir() + "/from-ckpt.npy";
  r = Psctl({"--checkpoint=" + saved.path(), "--out=" + npy, "dump", "layer/kernel"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto array = ReadNpyFile(npy);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ::testing::ElementsAre(64, 16));
  EXPECT_EQ(array->values, kernel);

  // Change one value of layer/kernel/1 inside its RocksDB: the database stays valid, and only
  // the shard's checksum can tell.
  const v1::SavedShard* target = nullptr;
  for (const v1::SavedShard& s : show.manifest().shards()) {
    if (s.name() == "layer/kernel" && s.partition() == 1) target = &s;
  }
  ASSERT_NE(target, nullptr);
  {
    rocksdb::DB* raw = nullptr;
    rocksdb::Status opened =
        rocksdb::DB::Open(rocksdb::Options(), saved.path() + "/" + target->file(), &raw);
    ASSERT_TRUE(opened.ok()) << opened.ToString();
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "d/layer/kernel/1", &value).ok());
    value[12] ^= 0x40;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "d/layer/kernel/1", value).ok());
  }
  r = Psctl({"--json", "ckpt", "verify", saved.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("layer/kernel/1"));
  psctl::CheckpointVerifyReport verify = ParseJson<psctl::CheckpointVerifyReport>(r.out);
  EXPECT_EQ(verify.failed(), 1);
  EXPECT_EQ(verify.ok(), show.manifest().shards_size() - 1);
  for (const psctl::ShardCheck& c : verify.shards()) {
    EXPECT_EQ(c.ok(), !(c.name() == "layer/kernel" && c.partition() == 1)) << c.ShortDebugString();
  }
  r = Psctl({"--checkpoint=" + saved.path(), "--out=" + npy + "2", "dump", "layer/kernel"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("layer/kernel/1"));
}

// ASYNC: updates move the values without moving the global step. Each save captures what has
// been applied: a new checkpoint (a later sequence of the same step), never the old one again.
TEST_F(PsctlTest, EverySaveCapturesEveryAppliedUpdate) {
  RunResult r = Psctl({chief(), "--json", "save"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const v1::CheckpointResponse first = ParseJson<v1::CheckpointResponse>(r.out);
  auto client = ClientFor(*model_);
  std::vector<float> gb(16, 0.5f);
  ASSERT_TRUE(client->Push({"b"}, {gb.data()}, 0).ok());
  const std::vector<float> live = Pull("b");
  r = Psctl({chief(), "--json", "save"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const v1::CheckpointResponse second = ParseJson<v1::CheckpointResponse>(r.out);
  EXPECT_NE(second.path(), first.path());
  EXPECT_EQ(second.step(), first.step());
  const std::string before = TmpDir() + "/b-first.npy", after = TmpDir() + "/b-second.npy";
  ASSERT_EQ(Psctl({"--checkpoint=" + first.path(), "--out=" + before, "dump", "b"}).exit_code, 0);
  ASSERT_EQ(Psctl({"--checkpoint=" + second.path(), "--out=" + after, "dump", "b"}).exit_code, 0);
  auto saved_before = ReadNpyFile(before);
  auto saved_after = ReadNpyFile(after);
  ASSERT_TRUE(saved_before.ok() && saved_after.ok());
  EXPECT_EQ(saved_after->values, live);
  EXPECT_NE(saved_before->values, live);
  // The newest checkpoint is the second one: a restore would bring the push back.
  r = Psctl({"--json", "ckpt", "list", *checkpoint_dir_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  psctl::CheckpointListReport list = ParseJson<psctl::CheckpointListReport>(r.out);
  ASSERT_GE(list.checkpoints_size(), 2);
  EXPECT_EQ(list.checkpoints(0).path(), second.path());
}

TEST(PsctlUnreachableTest, ADeadPsOrChiefIsNamedAndTheRestStillShows) {
  std::unique_ptr<TestCluster> cluster = StartCluster(TmpDir() + "/unreachable-ckpt");
  const v1::GetModelResponse model = ModelOf(*cluster);
  const std::string chief = "--chief=" + cluster->chief_address();
  const std::string ps1 = cluster->address("ps:1");
  ASSERT_TRUE(cluster->ps(1).Signal(SIGKILL).ok());
  ASSERT_TRUE(cluster->ps(1).WaitForExit(absl::Seconds(10)).ok());

  RunResult r = Psctl({chief, "vars"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("ps:1 (" + ps1 + ")"));
  EXPECT_THAT(r.out, HasSubstr("layer/kernel/0"));  // the chief's placement still shows
  EXPECT_THAT(r.out, HasSubstr("unreachable"));

  // A partition on ps:0 still reads; one on ps:1 is named unreachable.
  std::string on_ps0, on_ps1;
  for (const v1::DensePartition& p : model.placement().partitions()) {
    (p.ps_task() == 0 ? on_ps0 : on_ps1) = absl::StrCat(p.variable(), "/", p.partition());
  }
  r = Psctl({chief, "shard", on_ps0});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Psctl({chief, "shard", on_ps1});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("ps:1 (" + ps1 + ")"));

  r = Psctl({chief, "--rate_window_secs=0", "status"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach ps:1 at " + ps1));
  EXPECT_THAT(r.out, HasSubstr("chief:0"));

  cluster->KillAll();
  for (const char* command : {"vars", "status", "save"}) {
    r = Psctl({chief, command});
    EXPECT_EQ(r.exit_code, 1) << command;
    EXPECT_THAT(r.err, HasSubstr("cannot reach the chief at " + cluster->chief_address()))
        << command;
  }
  r = Psctl({"vars"});  // no chief named anywhere
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no chief"));
}

}  // namespace
}  // namespace pscluster
