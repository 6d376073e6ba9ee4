// Replication of dense updates (issue 37, docs/replication.md), one component at a time: a
// primary store forwards what it applied, in its order, and answers only once the forward went
// through; a backup store applies forwards in the primary's order, whatever order they arrive
// in, and never twice. The forwarder here hands forwards to the backup store directly; the
// real one (gRPC between ps daemons) is tested in tests/ps_cluster_test.cc.
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/backup_stores.h"
#include "ps_server/parameter_store.h"
#include "ps_server/ps_metrics.h"
#include "ps_server/push_forwarder.h"
#include "sharding/sparse_hash.h"
#include "storage/crash_points.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

// A variable of Adam (whose result depends on the order of its updates), all of it.
v1::DenseShardSpec AdamShard(const std::string& name, int64_t n, int backup) {
  v1::DenseShardSpec s;
  s.mutable_variable()->set_name(name);
  s.mutable_variable()->mutable_shape()->add_dims(n);
  s.mutable_variable()->mutable_initializer()->set_kind(v1::InitializerSpec::UNIFORM);
  s.mutable_variable()->mutable_initializer()->set_min(-1);
  s.mutable_variable()->mutable_initializer()->set_max(1);
  s.mutable_variable()->mutable_optimizer()->mutable_adam()->set_learning_rate(0.01f);
  s.mutable_partition()->set_variable(name);
  s.mutable_partition()->set_num_partitions(1);
  s.mutable_partition()->set_row_end(n);
  s.mutable_partition()->set_backup_ps_task(backup);
  return s;
}

// The primary (ps:0, replication 2, backups on ps:1) and the backup of its shards.
void CreateBoth(ParameterStore& primary, ParameterStore& backup) {
  v1::CreateShardsRequest req;
  *req.add_dense() = AdamShard("a", 6, 1);
  *req.add_dense() = AdamShard("b", 3, 1);
  v1::CreateShardsResponse resp;
  v1::CreateShardsRequest as_primary = req;
  as_primary.set_replication(2);
  ASSERT_TRUE(primary.CreateShards(as_primary, &resp).ok());
  ASSERT_TRUE(backup.CreateShards(req, &resp).ok());
}

// The primary's shards as CreateBoth makes them, after their backup ps:1 died (DropBackup): no
// shard forwards anywhere until a copy gives it a new backup.
void CreateWithBackupLost(ParameterStore& primary) {
  ParameterStore died{ParameterStoreOptions()};
  CreateBoth(primary, died);
  EXPECT_EQ(primary.DropBackup(1), 2);
}

// ps:1's shards of "a" and "b" alone, as a backup of ps:0's (a task that came back empty).
void CreateBackupOnly(ParameterStore& backup) {
  v1::CreateShardsRequest req;
  *req.add_dense() = AdamShard("a", 6, 1);
  *req.add_dense() = AdamShard("b", 3, 1);
  v1::CreateShardsResponse created;
  ASSERT_TRUE(backup.CreateShards(req, &created).ok());
}

std::vector<float> Values(ParameterStore& store, const std::string& name) {
  v1::InspectShardRequest req;
  req.mutable_shard()->set_variable(name);
  req.set_values_count(1 << 10);
  absl::StatusOr<v1::InspectShardResponse> r = store.Inspect(req);
  CHECK(r.ok()) << r.status();
  std::vector<float> out(r->slice().size() / sizeof(float));
  memcpy(out.data(), r->slice().data(), r->slice().size());
  return out;
}

int64_t Updates(ParameterStore& store, const std::string& name) {
  v1::InspectShardRequest req;
  req.mutable_shard()->set_variable(name);
  absl::StatusOr<v1::InspectShardResponse> r = store.Inspect(req);
  CHECK(r.ok()) << r.status();
  return r->shard().applied_step();
}

// Applies one forward to `backup` as ParameterServer.Replicate does.
absl::Status ApplyForward(ParameterStore& backup, const DenseForward& f,
                          v1::ReplicateResponse* resp) {
  DensePush push;
  PS_RETURN_IF_ERROR(backup.StartPushDense(f.header.push(), &push, /*forwarded=*/true));
  for (size_t i = 0; i < f.grads.size(); ++i) {
    PS_RETURN_IF_ERROR(
        push.AddChunk(static_cast<int>(i), 0,
                      absl::string_view(reinterpret_cast<const char*>(f.grads[i].data()),
                                        f.grads[i].size() * sizeof(float))));
  }
  return backup.ApplyReplicatedDense(f.header, &push, resp);
}

// A forward's stream that applies it to the backup store at its commit, as the data plane's
// ReplicateStream does once the versions come. It says its commits queue, so the primary
// commits under its shards' locks, before its apply (the apply here, in-process, waits only for
// the backup's earlier updates, which were applied at their own commits); `fail_awaits` > 0
// makes the answer to an applied commit fail (the backup died before it answered).
class DirectStream : public ForwardStream {
 public:
  DirectStream(ParameterStore* backup, v1::ReplicateHeader header, std::atomic<int>* commits,
               std::atomic<int>* fail_awaits)
      : backup_(backup), header_(std::move(header)), commits_(commits), fail_awaits_(fail_awaits) {}
  bool CommitQueues() const override { return true; }
  absl::Status Write(const float* values, int64_t n) override {
    values_.insert(values_.end(), values, values + n);
    return absl::OkStatus();
  }
  absl::Status Commit(const v1::ReplicateHeader& commit) override {
    ++*commits_;
    DenseForward f;
    f.backup = 1;
    f.header = header_;
    *f.header.mutable_versions() = commit.versions();
    f.header.set_accepted(commit.accepted());
    f.header.set_dropped_stale(commit.dropped_stale());
    int64_t at = 0;
    for (int64_t n : header_.push().num_elements()) {
      f.grads.emplace_back(values_.data() + at, n);
      at += n;
    }
    result_ = ApplyForward(*backup_, f, &response_);
    return absl::OkStatus();
  }
  absl::Status Await(v1::ReplicateResponse* response) override {
    if (fail_awaits_->load() > 0 && fail_awaits_->fetch_sub(1) > 0) {
      return absl::UnavailableError("ps:1 closed the stream before it answered");
    }
    *response = response_;
    return result_;
  }

 private:
  ParameterStore* const backup_;
  const v1::ReplicateHeader header_;
  std::atomic<int>* const commits_;
  std::atomic<int>* const fail_awaits_;
  std::vector<float> values_;
  absl::Status result_;
  v1::ReplicateResponse response_;
};

// Hands forwards to a backup store (or keeps them), failing when told to.
class DirectForwarder : public PushForwarder {
 public:
  // With StreamTo(backup), streams (as the data plane's) to that store.
  std::unique_ptr<ForwardStream> OpenStream(int backup, const v1::ReplicateHeader& header,
                                            int64_t values) override {
    absl::MutexLock lock(&mu_);
    if (stream_to_ == nullptr) return nullptr;
    EXPECT_EQ(backup, 1);
    ++streams_;
    return std::make_unique<DirectStream>(stream_to_, header, &commits_, &fail_awaits_);
  }
  void StreamTo(ParameterStore* backup) {
    absl::MutexLock lock(&mu_);
    stream_to_ = backup;
  }
  int streams() {
    absl::MutexLock lock(&mu_);
    return streams_;
  }
  int commits() const { return commits_.load(); }
  void FailAwaits(int n) { fail_awaits_ = n; }
  absl::Status ForwardSparse(int backup, const v1::ReplicateSparseRequest& request) override {
    ParameterStore* to = nullptr;
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      if (fail_next_ > 0) {
        --fail_next_;
        return absl::UnavailableError("ps:1 is not answering");
      }
      to = backup_;
      if (to == nullptr) {
        kept_sparse_.push_back(request);
        return absl::OkStatus();
      }
    }
    EXPECT_EQ(backup, 1);
    v1::ReplicateSparseResponse resp;
    return to->ApplyReplicatedSparse(request, &resp);
  }
  std::vector<v1::ReplicateSparseRequest> kept_sparse() {
    absl::MutexLock lock(&mu_);
    return kept_sparse_;
  }
  // Installs the copy into the ApplyTo store, as ParameterServer.InstallReplica does; after
  // FailCopiesAfter(n), only n more.
  absl::Status SendReplica(int backup, const v1::DenseReplica& replica, bool* installed,
                           std::atomic<int64_t>* sent) override {
    ParameterStore* to = nullptr;
    {
      absl::MutexLock lock(&mu_);
      ++copies_;
      if (copies_left_ == 0) return absl::UnavailableError("ps:1 is not answering");
      if (copies_left_ > 0) --copies_left_;
      to = backup_;
    }
    EXPECT_EQ(backup, 1);
    if (sent != nullptr) *sent += static_cast<int64_t>(replica.values_and_slots().size());
    PS_RETURN_IF_ERROR(to->InstallReplica(replica, installed));
    std::function<void(int)> after;
    int copies = 0;
    {
      absl::MutexLock lock(&mu_);
      after = after_copy_;
      copies = copies_;
    }
    if (after) after(copies);
    return absl::OkStatus();
  }
  // A table stripe's copy, installed as ParameterServer.InstallReplica does (not counted in
  // copies(): table_copies()).
  absl::Status SendTableReplica(int backup, const v1::TableReplica& replica,
                                absl::Span<const int64_t> keys, absl::Span<const int64_t> counts,
                                absl::Span<const float> rows, bool* installed,
                                std::atomic<int64_t>* sent) override {
    ParameterStore* to = nullptr;
    {
      absl::MutexLock lock(&mu_);
      ++table_copies_;
      to = backup_;
    }
    EXPECT_EQ(backup, 1);
    EXPECT_EQ(keys.size(), static_cast<size_t>(replica.rows()));
    EXPECT_EQ(counts.size(), keys.size());
    if (sent != nullptr) *sent += static_cast<int64_t>(16 * keys.size() + 4 * rows.size());
    PS_RETURN_IF_ERROR(
        to->InstallTableReplica(replica, keys.data(), counts.data(), rows.data(), installed));
    std::function<void(int)> after;
    {
      absl::MutexLock lock(&mu_);
      after = after_table_copy_;
    }
    if (after) after(replica.stripe());
    return absl::OkStatus();
  }
  // Called (outside the lock) with the stripe of each table copy once it is installed.
  void AfterTableCopy(std::function<void(int)> f) {
    absl::MutexLock lock(&mu_);
    after_table_copy_ = std::move(f);
  }
  int table_copies() {
    absl::MutexLock lock(&mu_);
    return table_copies_;
  }
  // Called (outside the lock) with the number of copies so far after each copy is installed.
  void AfterCopy(std::function<void(int)> f) {
    absl::MutexLock lock(&mu_);
    after_copy_ = std::move(f);
  }
  void FailCopiesAfter(int n) {
    absl::MutexLock lock(&mu_);
    copies_left_ = n;
  }
  int copies() {
    absl::MutexLock lock(&mu_);
    return copies_;
  }
  absl::Status Forward(const ForwardList& list) override {
    ParameterStore* backup = nullptr;
    bool fail = false;
    absl::Duration fail_after;
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      if (fail_next_ > 0) {
        --fail_next_;
        fail = true;
      }
      fail_after = fail_after_;
      backup = backup_;
      if (backup == nullptr && !fail) {
        kept_.insert(kept_.end(), list.forwards.begin(), list.forwards.end());
        return absl::OkStatus();
      }
    }
    if (fail) {
      absl::SleepFor(fail_after);
      return absl::UnavailableError("ps:1 is not answering");
    }
    // Outside the lock: a forward may wait for another push's, as over the network.
    for (const DenseForward& f : list.forwards) {
      EXPECT_EQ(f.backup, 1);
      v1::ReplicateResponse resp;
      PS_RETURN_IF_ERROR(ApplyForward(*backup, f, &resp));
    }
    return absl::OkStatus();
  }
  void ApplyTo(ParameterStore* backup) {
    absl::MutexLock lock(&mu_);
    backup_ = backup;
  }
  // The next n forwards fail, each after `after` (a backup that stopped answering).
  void FailNext(int n, absl::Duration after = absl::ZeroDuration()) {
    absl::MutexLock lock(&mu_);
    fail_next_ = n;
    fail_after_ = after;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::vector<DenseForward> kept() {
    absl::MutexLock lock(&mu_);
    return kept_;
  }

 private:
  absl::Mutex mu_;
  ParameterStore* backup_ ABSL_GUARDED_BY(mu_) = nullptr;
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration fail_after_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  ParameterStore* stream_to_ ABSL_GUARDED_BY(mu_) = nullptr;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> commits_{0};
  std::atomic<int> fail_awaits_{0};
  std::vector<DenseForward> kept_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReplicateSparseRequest> kept_sparse_ ABSL_GUARDED_BY(mu_);
  int copies_left_ ABSL_GUARDED_BY(mu_) = -1;  // -1: every one
  std::function<void(int)> after_copy_ ABSL_GUARDED_BY(mu_);
  int copies_ ABSL_GUARDED_BY(mu_) = 0;
  int table_copies_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(int)> after_table_copy_ ABSL_GUARDED_BY(mu_);
};

ParameterStoreOptions WithForwarder(PushForwarder* forwarder) {
  ParameterStoreOptions options;
  options.forwarder = forwarder;
  return options;
}

// A push of `names` with gradients that differ per push (`i`), as client 7's push number i.
// With `stream`, as the data plane receives one: each gradient sent on to the backups as it
// arrives (OpenForwardStreams, PushStreams::Piece).
absl::Status Push(ParameterStore& store, const std::vector<std::string>& names, int i,
                  v1::PushDenseResponse* resp, bool stream = false) {
  v1::PushDenseHeader header;
  std::vector<std::vector<float>> grads;
  for (const std::string& name : names) {
    header.add_shards()->set_variable(name);
    const int64_t n = name == "a" ? 6 : 3;
    header.add_num_elements(n);
    std::vector<float> g(n);
    for (int64_t j = 0; j < n; ++j) g[j] = 0.25f * static_cast<float>((i * 5 + j * 3) % 7) - 0.7f;
    grads.push_back(g);
  }
  header.mutable_request_id()->set_client(7);
  header.mutable_request_id()->set_seq(i);
  DensePush push;
  PS_RETURN_IF_ERROR(store.StartPushDense(header, &push));
  std::unique_ptr<PushStreams> streams = stream ? store.OpenForwardStreams(push) : nullptr;
  for (size_t k = 0; k < grads.size(); ++k) {
    PS_RETURN_IF_ERROR(push.AddChunk(
        static_cast<int>(k), 0,
        absl::string_view(reinterpret_cast<const char*>(grads[k].data()), grads[k].size() * 4)));
    if (streams != nullptr) {
      streams->Piece(static_cast<int>(k), push.values(static_cast<int>(k)),
                     static_cast<int64_t>(grads[k].size()));
    }
  }
  return store.FinishPushDense(&push, resp, streams.get());
}

void ExpectSameAs(ParameterStore& backup, ParameterStore& primary) {
  for (const char* name : {"a", "b"}) {
    EXPECT_EQ(Values(backup, name), Values(primary, name)) << name;  // bit for bit
    EXPECT_EQ(Updates(backup, name), Updates(primary, name)) << name;
  }
}

TEST(ReplicationTest, ABackupAppliesWhatItsPrimaryAppliedBitForBit) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup{ParameterStoreOptions()};
  CreateBoth(primary, backup);
  forwarder.ApplyTo(&backup);
  // Pushes from several threads at once, of one or both variables.
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        v1::PushDenseResponse resp;
        const std::vector<std::string> names =
            i % 3 == 0 ? std::vector<std::string>{"a"} : std::vector<std::string>{"a", "b"};
        if (!Push(primary, names, 1 + t * 100 + i, &resp).ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(Updates(primary, "a"), 100);
  ExpectSameAs(backup, primary);
}

// Pushes streamed to the backup as they arrive (as over the data plane), from several threads:
// each is committed under its shards' locks, once it has its place in their order and before
// the primary applies it (the backup applying it meanwhile), and the backup ends bit for bit
// the primary's: a commit with another push's versions, or numbered before the push had its
// place, would apply gradients out of the primary's order (Adam) or wait and fail.
TEST(ReplicationTest, StreamedPushesAreCommittedBeforeTheirApplyAndBackedUpBitForBit) {
  DirectForwarder forwarder;
  ParameterStoreOptions options = WithForwarder(&forwarder);
  options.replica_wait = absl::Seconds(2);
  ParameterStore primary(options);
  ParameterStore backup{ParameterStoreOptions()};
  CreateBoth(primary, backup);
  forwarder.ApplyTo(&backup);
  forwarder.StreamTo(&backup);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        v1::PushDenseResponse resp;
        const std::vector<std::string> names =
            i % 3 == 0 ? std::vector<std::string>{"b"} : std::vector<std::string>{"a", "b"};
        absl::Status s = Push(primary, names, 1 + t * 100 + i, &resp, /*stream=*/true);
        if (!s.ok()) {
          ++failures;
          LOG(ERROR) << s;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(Updates(primary, "b"), 100);
  EXPECT_EQ(forwarder.streams(), 100);
  EXPECT_EQ(forwarder.commits(), 100);
  EXPECT_EQ(forwarder.calls(), 0);  // nothing forwarded after an apply
  const ParameterStore::ForwardTotals totals = primary.forward_totals();
  EXPECT_EQ(totals.acknowledged, 100);
  EXPECT_EQ(totals.committed_early, 100);
  EXPECT_EQ(totals.streams_fell_back, 0);
  ExpectSameAs(backup, primary);
}

// A push committed before its apply whose backup applied it but whose answer never came: the
// primary forwards it again after its apply, which the backup answers as already applied; the
// worker is answered, and the backup holds the push once.
TEST(ReplicationTest, AnEarlyCommitWhoseAnswerFailedIsForwardedAgainAndAppliedOnce) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup{ParameterStoreOptions()};
  CreateBoth(primary, backup);
  forwarder.ApplyTo(&backup);
  forwarder.StreamTo(&backup);
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(primary, {"a", "b"}, 1, &resp, /*stream=*/true).ok());
  forwarder.FailAwaits(1);
  ASSERT_TRUE(Push(primary, {"a", "b"}, 2, &resp, /*stream=*/true).ok());
  EXPECT_FALSE(resp.duplicate());
  EXPECT_EQ(resp.accepted(), 2);
  EXPECT_EQ(forwarder.commits(), 2);
  EXPECT_EQ(forwarder.calls(), 1);  // the second push again, after its apply
  const ParameterStore::ForwardTotals totals = primary.forward_totals();
  EXPECT_EQ(totals.committed_early, 1);
  EXPECT_EQ(totals.streams_fell_back, 1);
  EXPECT_EQ(totals.acknowledged, 2);
  EXPECT_EQ(Updates(backup, "a"), 2);
  ExpectSameAs(backup, primary);
  // The push's retry is a duplicate on both.
  ASSERT_TRUE(Push(primary, {"a", "b"}, 2, &resp, /*stream=*/true).ok());
  EXPECT_TRUE(resp.duplicate());
  ExpectSameAs(backup, primary);
}

TEST(ReplicationTest, ForwardsThatArriveOutOfOrderAreAppliedInThePrimarysOrder) {
  DirectForwarder forwarder;  // keeps the forwards
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup{ParameterStoreOptions()};
  CreateBoth(primary, backup);
  for (int i = 1; i <= 6; ++i) {
    v1::PushDenseResponse resp;
    ASSERT_TRUE(Push(primary,
                     i % 2 ? std::vector<std::string>{"a", "b"} : std::vector<std::string>{"b"}, i,
                     &resp)
                    .ok());
  }
  std::vector<DenseForward> kept = forwarder.kept();
  ASSERT_EQ(kept.size(), 6u);
  // Newest first, each on a thread of its own: each waits for those before it.
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kept.size());
  for (int k = static_cast<int>(kept.size()) - 1; k >= 0; --k) {
    threads.emplace_back([&, k] {
      v1::ReplicateResponse resp;
      results[k] = ApplyForward(backup, kept[k], &resp);
      if (results[k].ok()) EXPECT_EQ(resp.applied(), kept[k].header.versions_size());
    });
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  ExpectSameAs(backup, primary);

  // A forward sent again is not applied again.
  v1::ReplicateResponse again;
  ASSERT_TRUE(ApplyForward(backup, kept[2], &again).ok());
  EXPECT_EQ(again.applied(), 0);
  EXPECT_EQ(again.already_applied(), kept[2].header.versions_size());
  ExpectSameAs(backup, primary);
}

TEST(ReplicationTest, APushWhoseForwardFailedIsForwardedAgainByItsRetryAndAppliedOnce) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup{ParameterStoreOptions()};
  CreateBoth(primary, backup);
  forwarder.ApplyTo(&backup);
  const std::vector<float> before = Values(primary, "a");
  forwarder.FailNext(1);
  v1::PushDenseResponse resp;
  absl::Status s = Push(primary, {"a", "b"}, 1, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("applied on this ps task but not yet on its backup"));
  EXPECT_THAT(s.message(), HasSubstr("ps:1 is not answering"));
  EXPECT_NE(Values(primary, "a"), before);  // applied here
  EXPECT_EQ(Values(backup, "a"), before);   // not there

  // The worker's retry, same request id: forwarded again, answered as a duplicate, applied
  // once on both.
  v1::PushDenseResponse retry;
  ASSERT_TRUE(Push(primary, {"a", "b"}, 1, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(retry.accepted(), 2);
  EXPECT_EQ(forwarder.calls(), 2);
  EXPECT_EQ(Updates(primary, "a"), 1);
  ExpectSameAs(backup, primary);
  // A further retry owes nothing: answered without forwarding.
  ASSERT_TRUE(Push(primary, {"a", "b"}, 1, &retry).ok());
  EXPECT_EQ(forwarder.calls(), 2);
}

// A push whose forward failed and whose worker never retries (it died) must not leave its
// backup behind for good: the next push's forward sends the owed one first, so the backup
// never waits for it, and a late retry is answered without forwarding again.
TEST(ReplicationTest, ForwardsOwedByAPushNeverRetriedGoWithTheNextPush) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStoreOptions waits_briefly;
  waits_briefly.replica_wait = absl::Seconds(2);
  ParameterStore backup(waits_briefly);
  CreateBoth(primary, backup);
  forwarder.ApplyTo(&backup);
  forwarder.FailNext(1);
  v1::PushDenseResponse resp;
  EXPECT_EQ(Push(primary, {"a", "b"}, 1, &resp).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(primary.forward_totals().owed, 1);
  EXPECT_EQ(primary.forward_totals().failed, 1);

  // Another push, of "a" alone: its forward waits for nothing.
  const absl::Time start = absl::Now();
  ASSERT_TRUE(Push(primary, {"a"}, 2, &resp).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(primary.forward_totals().owed, 0);
  EXPECT_EQ(Updates(backup, "a"), 2);
  EXPECT_EQ(Updates(backup, "b"), 1);
  ExpectSameAs(backup, primary);

  // The first push's retry, late: a duplicate that owes nothing any more.
  const int calls = forwarder.calls();
  v1::PushDenseResponse retry;
  ASSERT_TRUE(Push(primary, {"a", "b"}, 1, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(forwarder.calls(), calls);
  ExpectSameAs(backup, primary);
}

// (Below: the table "emb" on both, its virtual shards backed up on ps:1.)
v1::TableShardSpec EmbSpec();
void CreateTables(ParameterStore& primary, ParameterStore& backup,
                  const v1::TableShardSpec& spec = EmbSpec());

// A primary (ps:0, forwarding with a DirectForwarder) whose first push to reach the crash point
// push_applied, in its test form, is held there (applied, not forwarded) until `release` is
// notified; and its backup, which waits 3 s (replica_wait) for a forward's predecessors.
struct HeldAfterItsFirstApply {
  // Both stores hold the dense shards "a" and "b" (CreateBoth), or the table "emb"
  // (CreateTables), and the forwarder applies the primary's forwards to the backup.
  explicit HeldAfterItsFirstApply(bool tables = false)
      : points(CrashPoints::ForTest(kCrashPushApplied, 1,
                                    [this] {
                                      held.Notify();
                                      release.WaitForNotification();
                                    })),
        primary(PrimaryOptions(&forwarder, points.get())),
        backup(BackupOptions()) {
    if (tables) {
      CreateTables(primary, backup);
    } else {
      CreateBoth(primary, backup);
    }
    forwarder.ApplyTo(&backup);
  }
  // Runs `push` on a thread of its own and returns once it is held at push_applied; *status is
  // its result once the thread ends (after `release`).
  std::thread StartHeld(std::function<absl::Status()> push, absl::Status* status) {
    std::thread t([push = std::move(push), status] { *status = push(); });
    held.WaitForNotification();
    return t;
  }
  static ParameterStoreOptions PrimaryOptions(PushForwarder* forwarder, CrashPoints* points) {
    ParameterStoreOptions options = WithForwarder(forwarder);
    options.crash_points = points;
    return options;
  }
  static ParameterStoreOptions BackupOptions() {
    ParameterStoreOptions options;
    options.replica_wait = absl::Seconds(3);
    return options;
  }

  DirectForwarder forwarder;
  absl::Notification held, release;
  std::unique_ptr<CrashPoints> points;
  ParameterStore primary;
  ParameterStore backup;
};

// Push P is applied (number n) and held before its forward (the crash point push_applied, in
// its test form); push A is applied after it (n + 1) and its forward fails: owed. P's forward
// must not send A's first: the backup would wait replica_wait for P's update while P's thread
// waited for A's answer (the 30 s stall docs/replication.md tells of). A stays owed for its
// retry, which then finds the backup ready for it.
TEST(ReplicationTest, AnEarlierPushsForwardDoesNotSendALaterPushsOwedForwardFirst) {
  HeldAfterItsFirstApply h;
  DirectForwarder& forwarder = h.forwarder;
  ParameterStore& primary = h.primary;
  ParameterStore& backup = h.backup;

  absl::Status first;
  std::thread p = h.StartHeld(
      [&] {
        v1::PushDenseResponse resp;
        return Push(primary, {"a", "b"}, 1, &resp);
      },
      &first);
  EXPECT_EQ(Updates(primary, "a"), 1);  // P applied here, not forwarded yet
  forwarder.FailNext(1);
  v1::PushDenseResponse resp;
  EXPECT_EQ(Push(primary, {"a", "b"}, 2, &resp).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(primary.forward_totals().owed, 1);
  EXPECT_EQ(Updates(primary, "a"), 2);
  const absl::Time start = absl::Now();
  h.release.Notify();
  p.join();
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_LT(took, absl::Seconds(1)) << "P's forward waited for A's owed one";
  EXPECT_EQ(Updates(backup, "a"), 1);
  EXPECT_EQ(primary.forward_totals().owed, 1);  // A's, for its retry

  // A's retry (same id): its forward goes now, the backup applies it after P's.
  v1::PushDenseResponse retry;
  ASSERT_TRUE(Push(primary, {"a", "b"}, 2, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(primary.forward_totals().owed, 0);
  EXPECT_EQ(Updates(backup, "a"), 2);
  ExpectSameAs(backup, primary);
}

// Two owed forwards, owed the wrong way round: P (applied first) held at push_applied while A
// (applied after it) has its forward fail, then P's own forward fails too, so the store owes A's
// before P's. A's retry resends them in their pushes' order, P's first: sent A first, the backup
// waited replica_wait for P's update behind it, in the same loop (a 30 s stall seen in
// failover_test's ChiefRestartTest, where two pushes' forwards failed at once after a rebuild).
TEST(ReplicationTest, ARetryResendsOwedForwardsInTheirPushesOrder) {
  HeldAfterItsFirstApply h;
  DirectForwarder& forwarder = h.forwarder;
  ParameterStore& primary = h.primary;
  ParameterStore& backup = h.backup;

  absl::Status first;
  std::thread p = h.StartHeld(
      [&] {
        v1::PushDenseResponse resp;
        return Push(primary, {"a", "b"}, 1, &resp);
      },
      &first);
  forwarder.FailNext(1);
  v1::PushDenseResponse resp;
  EXPECT_EQ(Push(primary, {"a", "b"}, 2, &resp).code(), absl::StatusCode::kUnavailable);
  forwarder.FailNext(1);  // P's own forward, after A's owed one was left for A's retry
  h.release.Notify();
  p.join();
  EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
  EXPECT_EQ(primary.forward_totals().owed, 2);
  EXPECT_EQ(Updates(backup, "a"), 0);

  const absl::Time start = absl::Now();
  v1::PushDenseResponse retry;
  const absl::Status again = Push(primary, {"a", "b"}, 2, &retry);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "A's forward waited for P's at the backup";
  ASSERT_TRUE(again.ok()) << again;
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(primary.forward_totals().owed, 0);
  EXPECT_EQ(Updates(backup, "a"), 2);
  ExpectSameAs(backup, primary);
}

// An owed forward that fails again holds back the later pushes' forwards to the same backup:
// they stay owed, unsent, and the retry is answered at once, rather than after each of them
// waited replica_wait at the backup for the one that failed.
TEST(ReplicationTest, AnOwedForwardThatFailsAgainHoldsBackTheLaterOnes) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup(HeldAfterItsFirstApply::BackupOptions());
  CreateBoth(primary, backup);
  forwarder.ApplyTo(&backup);
  v1::PushDenseResponse resp;
  forwarder.FailNext(1);
  EXPECT_EQ(Push(primary, {"a", "b"}, 1, &resp).code(), absl::StatusCode::kUnavailable);
  // Push 2 resends push 1's forward first, which fails again: push 2's own is not sent.
  forwarder.FailNext(1);
  int calls = forwarder.calls();
  EXPECT_EQ(Push(primary, {"a", "b"}, 2, &resp).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(forwarder.calls(), calls + 1);
  EXPECT_EQ(primary.forward_totals().owed, 2);

  // Push 2's retry: push 1's forward fails once more, push 2's stays owed, unsent.
  forwarder.FailNext(1);
  calls = forwarder.calls();
  absl::Time start = absl::Now();
  EXPECT_EQ(Push(primary, {"a", "b"}, 2, &resp).code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(forwarder.calls(), calls + 1);
  EXPECT_EQ(Updates(backup, "a"), 0);

  // The next retry finds the backup answering: both go, in order.
  start = absl::Now();
  ASSERT_TRUE(Push(primary, {"a", "b"}, 2, &resp).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(resp.duplicate());
  EXPECT_EQ(primary.forward_totals().owed, 0);
  ExpectSameAs(backup, primary);
}

// A task's own shards and the backups it holds share its memory budget: neither side can take
// the task past it, whichever is created first.
TEST(ReplicationTest, BackupsCountAgainstTheTasksMemoryBudget) {
  ParameterStoreOptions options;
  options.memory_budget_bytes = 20000;  // an Adam shard of n floats holds 12 n bytes
  ParameterStore own(options);
  BackupStores backups(options);
  backups.ShareBudget(&own);
  v1::CreateShardsResponse resp;
  v1::CreateShardsRequest mine;
  *mine.add_dense() = AdamShard("a", 1000, 1);
  ASSERT_TRUE(own.CreateShards(mine, &resp).ok());
  auto backup_of = [](const std::string& name, int64_t n) {
    v1::CreateShardsRequest req;
    v1::BackupShards* b = req.add_backups();
    b->set_primary_ps_task(1);
    *b->add_dense() = AdamShard(name, n, 0);
    return req;
  };
  // 12,000 here and 12,000 of backups would pass 20,000: refused, naming the other stores.
  absl::Status s = backups.Create(0, backup_of("b", 1000), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("12000 of them in its other stores"));
  ASSERT_TRUE(backups.Create(0, backup_of("c", 300), &resp).ok());
  EXPECT_EQ(backups.HeldBytes(), own.held_bytes() - 12000 + 3600);
  // And the task's own shards now find the backups' 3,600 bytes taken.
  v1::CreateShardsRequest more;
  *more.add_dense() = AdamShard("d", 500, 1);
  s = own.CreateShards(more, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("3600 of them in its other stores"));
  more.mutable_dense(0)->mutable_variable()->mutable_shape()->set_dims(0, 300);
  more.mutable_dense(0)->mutable_partition()->set_row_end(300);
  EXPECT_TRUE(own.CreateShards(more, &resp).ok());
}

// Rebuild (issue 37): ps:1, the backup, died and the primary went on alone (DropBackup); ps:1
// comes back empty. Each shard is copied for it while three clients push, and each copy is
// installed a little later, so that forwards of pushes applied after the copy reach it first
// and wait for the copy. Every push ends up in the new backup once, in the primary's order: it
// is the primary bit for bit (Adam's slots and the update counts included), and a retry of a
// push applied before the copy, once the new backup is promoted, is a duplicate.
TEST(ReplicationTest, ANewBackupCopiedWhilePushesGoOnEndsEqualToItsPrimary) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  CreateWithBackupLost(primary);
  v1::PushDenseResponse resp;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Push(primary, {"a", "b"}, i, &resp).ok());
  EXPECT_EQ(forwarder.calls(), 0);  // nothing forwarded while ps:1 was gone

  ParameterStore fresh{ParameterStoreOptions()};  // ps:1's new incarnation
  CreateBackupOnly(fresh);
  forwarder.ApplyTo(&fresh);
  std::atomic<bool> copied{false};
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  for (int c = 0; c < 3; ++c) {
    clients.emplace_back([&, c] {
      for (int j = 0; j < 40; ++j) {
        // Half before the copies, half after.
        if (j == 20) {
          while (!copied.load()) absl::SleepFor(absl::Milliseconds(1));
        }
        v1::PushDenseResponse r;
        absl::Status s = Push(primary, {"a", "b"}, 100 + c * 100 + j, &r);
        if (!s.ok()) {
          ADD_FAILURE() << s;
          ++failures;
        }
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(5));
  v1::DenseReplica copy_a, copy_b;
  v1::ShardRef a, b;
  a.set_variable("a");
  b.set_variable("b");
  // One shard after the other, each copy sent before the next is taken, as RebuildBackup does
  // (b's copy waits for the pushes below its cut that forward a's update, which wait for a's
  // copy: taken both first, they would wait for each other until the primary's replica_wait).
  bool installed = false;
  ASSERT_TRUE(primary.CopyForNewBackup(a, 1, &copy_a).ok());
  absl::SleepFor(absl::Milliseconds(50));  // forwards after the copy wait for it
  ASSERT_TRUE(fresh.InstallReplica(copy_a, &installed).ok());
  EXPECT_TRUE(installed);
  ASSERT_TRUE(primary.CopyForNewBackup(b, 1, &copy_b).ok());
  EXPECT_GE(copy_a.updates(), 20);
  EXPECT_GT(copy_a.ledger_size(), 0);
  copied = true;
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(fresh.InstallReplica(copy_b, &installed).ok());
  EXPECT_TRUE(installed);
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(forwarder.calls(), 0);
  EXPECT_EQ(Updates(primary, "a"), 20 + 3 * 40);
  ExpectSameAs(fresh, primary);
  // A copy installed again, being older than the shard now, changes nothing.
  ASSERT_TRUE(fresh.InstallReplica(copy_a, &installed).ok());
  EXPECT_FALSE(installed);
  ExpectSameAs(fresh, primary);
  // Promoted, the new backup answers a retry of a push applied before the copy as a duplicate.
  ASSERT_TRUE(Push(fresh, {"a", "b"}, 7, &resp).ok());
  EXPECT_TRUE(resp.duplicate());
  ExpectSameAs(fresh, primary);
}

// Holds every forward (to any task) until Release(), then lets it through as applied: a
// push applied on its primary whose answer waits for a slow backup elsewhere.
class HoldingForwarder : public PushForwarder {
 public:
  absl::Status Forward(const ForwardList& list) override {
    absl::MutexLock lock(&mu_);
    ++held_;
    mu_.Await(absl::Condition(&released_));
    return absl::OkStatus();
  }
  // Whether `n` forwards have come (and are held) within 10 s.
  bool AwaitHeld(int n) {
    absl::MutexLock lock(&mu_);
    const auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  absl::Status SendReplica(int backup, const v1::DenseReplica& replica, bool* installed,
                           std::atomic<int64_t>* sent) override {
    return absl::UnimplementedError("the test sends the copies itself");
  }

 private:
  absl::Mutex mu_;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// A push applied to a shard before its copy for a new backup, but not answered yet when the
// copy is taken (its forward to another task's backup is slow), is in the copy's values: its
// id must be in the copy's ledger too, or the worker's retry on the new backup, promoted once
// the primary died before answering, would apply it a second time. The copy takes it from the
// pushes applied but not answered, without waiting for the answer (which may wait for a
// backup for as long as replica_wait).
TEST(ReplicationTest, ACopyCarriesTheIdsOfPushesAppliedBeforeItButNotAnsweredYet) {
  HoldingForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  v1::CreateShardsRequest req;
  *req.add_dense() = AdamShard("a", 6, 1);  // ps:1 died and came back empty: backed up again
  *req.add_dense() = AdamShard("c", 3, 2);  // ps:2, alive but slow
  req.set_replication(2);
  v1::CreateShardsResponse created;
  ASSERT_TRUE(primary.CreateShards(req, &created).ok());
  EXPECT_EQ(primary.DropBackup(1), 1);
  v1::ShardRef a;
  a.set_variable("a");

  // Push 5 applied to "a" and "c"; its answer waits for ps:2 until the copy is taken.
  v1::PushDenseResponse resp5;
  std::thread push5([&] { EXPECT_TRUE(Push(primary, {"a", "c"}, 5, &resp5).ok()); });
  if (!forwarder.AwaitHeld(1)) {
    forwarder.Release();
    push5.join();
    FAIL() << "push 5 never reached its forward to ps:2";
  }
  const std::vector<float> a_after_5 = Values(primary, "a");
  v1::DenseReplica copy;
  const absl::Status copied = primary.CopyForNewBackup(a, 1, &copy);
  forwarder.Release();  // (before any ASSERT: the push must end either way)
  push5.join();
  ASSERT_TRUE(copied.ok()) << copied;
  EXPECT_EQ(copy.updates(), 1);
  int carried = 0;
  for (const v1::LedgerEntry& e : copy.ledger()) {
    if (e.id().client() == 7 && e.id().seq() == 5) {
      ++carried;
      EXPECT_EQ(e.accepted(), 2);  // as the push was answered
    }
  }
  EXPECT_EQ(carried, 1);

  // ps:1, given the copy and promoted: the retry of push 5 is a duplicate, "a" unchanged.
  ParameterStore fresh{ParameterStoreOptions()};
  CreateBackupOnly(fresh);
  bool installed = false;
  ASSERT_TRUE(fresh.InstallReplica(copy, &installed).ok());
  EXPECT_TRUE(installed);
  v1::PushDenseResponse retry;
  ASSERT_TRUE(Push(fresh, {"a"}, 5, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(retry.accepted(), 2);
  EXPECT_EQ(Values(fresh, "a"), a_after_5);
  EXPECT_EQ(Updates(fresh, "a"), 1);
}

// A push that arrived over the data plane had a stream to the backup for "b" only: "a" got
// its new backup (ps:1, back after it died) while the push arrived. "a"'s update, applied
// after the copy, has no stream: the push goes to the backup whole after the apply instead,
// in one forward (the stream abandoned), so that the backup never records the push with "a"'s
// update missing.
TEST(ReplicationTest, APushThatArrivedBeforeItsShardGotANewBackupIsForwardedAfterItsApply) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  CreateWithBackupLost(primary);
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(primary, {"a", "b"}, 1, &resp).ok());
  ParameterStore backup{ParameterStoreOptions()};  // ps:1 back, empty
  CreateBackupOnly(backup);
  forwarder.ApplyTo(&backup);
  forwarder.StreamTo(&backup);
  v1::ShardRef a, b;
  a.set_variable("a");
  b.set_variable("b");
  v1::DenseReplica copy;
  bool installed = false;
  ASSERT_TRUE(primary.CopyForNewBackup(b, 1, &copy).ok());  // "b" first
  ASSERT_TRUE(backup.InstallReplica(copy, &installed).ok());

  v1::PushDenseHeader header;
  std::vector<std::vector<float>> grads = {std::vector<float>(6, 0.5f), {-0.25f, 0.75f, 1.0f}};
  header.add_shards()->set_variable("a");
  header.add_num_elements(6);
  header.add_shards()->set_variable("b");
  header.add_num_elements(3);
  header.mutable_request_id()->set_client(7);
  header.mutable_request_id()->set_seq(2);
  DensePush push;
  ASSERT_TRUE(primary.StartPushDense(header, &push).ok());
  std::unique_ptr<PushStreams> streams = primary.OpenForwardStreams(push);
  ASSERT_NE(streams, nullptr);
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(push.AddChunk(k, 0,
                              absl::string_view(reinterpret_cast<const char*>(grads[k].data()),
                                                grads[k].size() * sizeof(float)))
                    .ok());
    streams->Piece(k, push.values(k), static_cast<int64_t>(grads[k].size()));
  }
  // "a" gets its backup now, while the push has arrived but is not applied yet.
  ASSERT_TRUE(primary.CopyForNewBackup(a, 1, &copy).ok());
  EXPECT_EQ(copy.updates(), 1);
  ASSERT_TRUE(backup.InstallReplica(copy, &installed).ok());
  EXPECT_TRUE(installed);
  const int calls = forwarder.calls();
  ASSERT_TRUE(primary.FinishPushDense(&push, &resp, streams.get()).ok());
  streams.reset();  // (as the data plane does once the push is answered)
  EXPECT_EQ(forwarder.streams(), 1);
  EXPECT_EQ(forwarder.commits(), 0);        // abandoned
  EXPECT_EQ(forwarder.calls(), calls + 1);  // the whole push, after the apply
  EXPECT_EQ(Updates(primary, "a"), 2);
  ExpectSameAs(backup, primary);
}

// A forward owed to ps:1 when it died (of "a" and "b") is not sent to its next incarnation,
// which has a copy of "a" only: the copy holds what it carried, and "b" is not backed up
// there yet (sent, it would be refused there and stay owed for ever).
TEST(ReplicationTest, WhatWasOwedToADeadBackupIsNotSentToItsNextIncarnation) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore died{ParameterStoreOptions()};
  CreateBoth(primary, died);
  forwarder.ApplyTo(&died);
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(primary, {"a", "b"}, 1, &resp).ok());
  forwarder.FailNext(1);
  ASSERT_EQ(Push(primary, {"a", "b"}, 2, &resp).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(primary.forward_totals().owed, 1);
  EXPECT_EQ(primary.DropBackup(1), 2);
  ParameterStoreOptions waits_briefly;
  waits_briefly.replica_wait = absl::Seconds(2);
  ParameterStore fresh(waits_briefly);
  CreateBackupOnly(fresh);
  forwarder.ApplyTo(&fresh);
  v1::ShardRef a;
  a.set_variable("a");
  v1::DenseReplica copy;
  ASSERT_TRUE(primary.CopyForNewBackup(a, 1, &copy).ok());
  EXPECT_EQ(copy.updates(), 2);
  bool installed = false;
  ASSERT_TRUE(fresh.InstallReplica(copy, &installed).ok());
  const int calls = forwarder.calls();
  ASSERT_TRUE(Push(primary, {"a"}, 3, &resp).ok());
  EXPECT_EQ(forwarder.calls(), calls + 1);  // this push's forward alone
  EXPECT_EQ(primary.forward_totals().owed, 0);
  EXPECT_EQ(Values(fresh, "a"), Values(primary, "a"));
  EXPECT_EQ(Updates(fresh, "a"), 3);
  EXPECT_EQ(Updates(fresh, "b"), 0);  // not backed up there yet
  // The placement sent again (a CreateShards naming ps:1 as "a"'s backup, as the chief does):
  // "a"'s forwards still go to the new incarnation.
  v1::CreateShardsRequest again;
  *again.add_dense() = AdamShard("a", 6, 1);
  again.set_replication(2);
  v1::CreateShardsResponse created;
  ASSERT_TRUE(primary.CreateShards(again, &created).ok());
  ASSERT_TRUE(Push(primary, {"a"}, 4, &resp).ok());
  EXPECT_EQ(forwarder.calls(), calls + 2);
  EXPECT_EQ(Updates(fresh, "a"), 4);
  EXPECT_EQ(Values(fresh, "a"), Values(primary, "a"));
}

// The value of the series of `name` labelled key=value in `families` (below); -1 if none.
double Series(const std::vector<prometheus::MetricFamily>& families, const std::string& name,
              const std::string& key, const std::string& value);

// The chief's rebuild on the primary (ParameterStore::RebuildBackup): each shard copied and
// sent; bad requests refused before anything is copied; a copy that cannot be sent gives up
// the whole rebuild, so that no shard forwards to a backup that never got its copy.
TEST(ReplicationTest, ARebuildSendsEachShardsCopyOrLeavesNoShardBackedUpThere) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore died{ParameterStoreOptions()};
  CreateBoth(primary, died);
  forwarder.ApplyTo(&died);
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(primary, {"a", "b"}, 1, &resp).ok());
  EXPECT_EQ(primary.DropBackup(1), 2);
  ParameterStoreOptions waits_briefly;
  waits_briefly.replica_wait = absl::Seconds(2);
  ParameterStore fresh(waits_briefly);
  CreateBackupOnly(fresh);
  forwarder.ApplyTo(&fresh);
  v1::RebuildBackupRequest request;
  request.set_backup_ps_task(1);
  request.add_shards()->set_variable("a");
  request.add_shards()->set_variable("b");
  v1::RebuildBackupResponse rebuilt;
  // Bad requests: refused, nothing copied.
  {
    v1::RebuildBackupRequest bad = request;
    bad.set_backup_ps_task(0);
    absl::Status s = primary.RebuildBackup(bad, /*self=*/0, &rebuilt);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("RebuildBackup names ps:0; expected another"));
    bad = request;
    bad.clear_shards();
    s = primary.RebuildBackup(bad, 0, &rebuilt);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("names no shard"));
    bad = request;
    *bad.add_shards() = request.shards(0);
    s = primary.RebuildBackup(bad, 0, &rebuilt);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("twice"));
    bad = request;
    bad.mutable_shards(1)->set_variable("c");
    s = primary.RebuildBackup(bad, 0, &rebuilt);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_EQ(forwarder.copies(), 0);
  }
  // "b"'s copy cannot be sent: neither shard forwards to ps:1 afterwards.
  forwarder.FailCopiesAfter(1);
  absl::Status s = primary.RebuildBackup(request, 0, &rebuilt);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rebuild of b/0 on ps:1"));
  // What the copies did, as Prometheus shows it: "a"'s 72 bytes sent, "b"'s 36 taken and given
  // up.
  {
    BackupStores none{ParameterStoreOptions()};
    const std::vector<prometheus::MetricFamily> f = PsMetricFamilies(primary, &none);
    EXPECT_EQ(Series(f, "pscluster_ps_rebuild_bytes_total", "state", "copied"), 108);
    EXPECT_EQ(Series(f, "pscluster_ps_rebuild_bytes_total", "state", "sent"), 72);
    EXPECT_EQ(Series(f, "pscluster_ps_rebuild_bytes_total", "state", "abandoned"), 36);
    EXPECT_EQ(Series(f, "pscluster_ps_rebuild_copies_total", "outcome", "sent"), 1);
    EXPECT_EQ(Series(f, "pscluster_ps_rebuild_copies_total", "outcome", "failed"), 1);
  }
  int calls = forwarder.calls();
  ASSERT_TRUE(Push(primary, {"a", "b"}, 2, &resp).ok());
  EXPECT_EQ(forwarder.calls(), calls);
  // Again, with the copies going through: the new backup follows its primary from there.
  forwarder.FailCopiesAfter(-1);
  ASSERT_TRUE(primary.RebuildBackup(request, 0, &rebuilt).ok());
  EXPECT_EQ(rebuilt.shards_copied(), 2);
  EXPECT_EQ(rebuilt.bytes_copied(), (6 + 3) * 3 * 4);  // Adam: values and two slots
  const ParameterStore::RebuildTotals totals = primary.rebuild_totals();
  EXPECT_EQ(totals.bytes_copied, 2 * (6 + 3) * 3 * 4);
  EXPECT_EQ(totals.bytes_sent + totals.bytes_abandoned, totals.bytes_copied);  // none on its way
  EXPECT_EQ(totals.copies_sent, 3);
  ExpectSameAs(fresh, primary);
  calls = forwarder.calls();
  ASSERT_TRUE(Push(primary, {"a", "b"}, 3, &resp).ok());
  EXPECT_EQ(forwarder.calls(), calls + 1);
  ExpectSameAs(fresh, primary);
  EXPECT_EQ(Updates(fresh, "a"), 3);
  // An attempt whose caller gave up while it waited for the one before it changes nothing
  // (giving it up would drop what a later attempt did).
  s = primary.RebuildBackup(request, 0, &rebuilt, [] { return true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  calls = forwarder.calls();
  ASSERT_TRUE(Push(primary, {"a", "b"}, 4, &resp).ok());
  EXPECT_EQ(forwarder.calls(), calls + 1);
  ExpectSameAs(fresh, primary);
}

// One rebuild onto ps:1 copies "a", then "b". A push applied between the two copies updates
// "a" with a forward to ps:1 and "b" before its copy: it is in "b"'s copy, so "b"'s copy
// carries its id as done. If its forward to ps:1 failed, ps:1, promoted, would hold the push
// in "b" alone and answer the worker's retry as a duplicate: "a" would never have it. The
// copy of "b" waits for such forwards and gives the rebuild up when one failed; the next
// rebuild copies "a" with the push in it. The forward fails at once, or (Slow) only after
// "b"'s copy was taken: the copy must wait for it, not read it as not owed yet.
class ForwardFailingBetweenCopiesTest : public ::testing::TestWithParam<bool> {};

TEST_P(ForwardFailingBetweenCopiesTest, GivesTheRebuildUp) {
  const bool slow = GetParam();
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  CreateWithBackupLost(primary);
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(primary, {"a", "b"}, 1, &resp).ok());
  ParameterStoreOptions waits_briefly;
  waits_briefly.replica_wait = absl::Seconds(5);
  ParameterStore fresh(waits_briefly);  // ps:1, back
  CreateBackupOnly(fresh);
  forwarder.ApplyTo(&fresh);
  absl::Status push9 = absl::UnknownError("not pushed");
  std::thread pusher;
  forwarder.AfterCopy([&](int copies) {
    if (copies != 1) return;  // after "a"'s copy, before "b"'s
    forwarder.FailNext(1, slow ? absl::Milliseconds(300) : absl::ZeroDuration());
    const int calls = forwarder.calls();
    pusher = std::thread([&] {
      v1::PushDenseResponse r;
      push9 = Push(primary, {"a", "b"}, 9, &r);
    });
    // Applied, and its forward on its way (failing now, or in 300 ms).
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (forwarder.calls() == calls && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    if (forwarder.calls() == calls) ADD_FAILURE() << "push 9 never reached its forward";
    if (!slow) pusher.join();
  });
  v1::RebuildBackupRequest request;
  request.set_backup_ps_task(1);
  request.add_shards()->set_variable("a");
  request.add_shards()->set_variable("b");
  v1::RebuildBackupResponse rebuilt;
  absl::Status s = primary.RebuildBackup(request, /*self=*/0, &rebuilt);
  forwarder.AfterCopy(nullptr);
  if (pusher.joinable()) pusher.join();
  EXPECT_EQ(push9.code(), absl::StatusCode::kUnavailable) << push9;  // applied, not on ps:1
  if (s.ok()) {
    // ps:1 would count as a backup now. Promoted, it would take the retry of push 9 as a
    // duplicate and stay without it in "a".
    v1::PushDenseResponse retry;
    ASSERT_TRUE(Push(fresh, {"a", "b"}, 9, &retry).ok());
    ExpectSameAs(fresh, primary);
    FAIL() << "the rebuild went through with push 9 in b's copy alone";
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rebuild of b/0 on ps:1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("has a forward to ps:1 that failed"));
  EXPECT_EQ(Updates(fresh, "a"), 1);  // without push 9
  // The chief's next try: both copies hold push 9, and ps:1 follows its primary from there.
  ASSERT_TRUE(primary.RebuildBackup(request, 0, &rebuilt).ok());
  EXPECT_EQ(rebuilt.shards_copied(), 2);
  ExpectSameAs(fresh, primary);
  ASSERT_TRUE(Push(primary, {"a", "b"}, 10, &resp).ok());
  ExpectSameAs(fresh, primary);
  // Promoted: the retry of push 9 is a duplicate, and each shard has it once.
  v1::PushDenseResponse retry;
  ASSERT_TRUE(Push(fresh, {"a", "b"}, 9, &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(Updates(fresh, "a"), 3);
  EXPECT_EQ(Updates(fresh, "b"), 3);
  ExpectSameAs(fresh, primary);
}

INSTANTIATE_TEST_SUITE_P(AtOnceOrSlow, ForwardFailingBetweenCopiesTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Slow" : "AtOnce";
                         });

// A push of `grads` ("a" then "b") as client 7's push number `seq`.
absl::Status PushGrads(ParameterStore& store, const std::vector<std::vector<float>>& grads, int seq,
                       v1::PushDenseResponse* resp) {
  v1::PushDenseHeader header;
  header.add_shards()->set_variable("a");
  header.add_num_elements(6);
  header.add_shards()->set_variable("b");
  header.add_num_elements(3);
  header.mutable_request_id()->set_client(7);
  header.mutable_request_id()->set_seq(seq);
  DensePush push;
  PS_RETURN_IF_ERROR(store.StartPushDense(header, &push));
  for (int k = 0; k < 2; ++k) {
    PS_RETURN_IF_ERROR(push.AddChunk(
        k, 0,
        absl::string_view(reinterpret_cast<const char*>(grads[k].data()), grads[k].size() * 4)));
  }
  return store.FinishPushDense(&push, resp, nullptr);
}

// The bytes of a shard's values (NaN compares unequal as a float, equal as its bytes).
std::string Bytes(ParameterStore& store, const std::string& name) {
  const std::vector<float> v = Values(store, name);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A primary whose --nan_policy lets NaN gradients through applies one; its backup, whose own
// policy refuses them, takes the forward as it is (the primary decided), so the two stay
// equal: before, the backup refused it and was left behind its primary for good. A worker's
// push of NaN to the backup store itself is still refused by its own policy.
TEST(ReplicationTest, ABackupTakesWhatItsPrimaryAppliedWhateverItsOwnNanPolicy) {
  DirectForwarder forwarder;
  ParameterStoreOptions allows = WithForwarder(&forwarder);
  allows.allow_non_finite = true;
  ParameterStore primary(allows);
  ParameterStoreOptions waits_briefly;
  waits_briefly.replica_wait = absl::Seconds(2);
  ParameterStore backup(waits_briefly);  // refuses NaN from workers
  CreateBoth(primary, backup);
  forwarder.ApplyTo(&backup);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  v1::PushDenseResponse resp;
  ASSERT_TRUE(
      PushGrads(primary, {std::vector<float>(6, 0.5f), {0.25f, nan, -1.0f}}, 1, &resp).ok());
  EXPECT_EQ(resp.accepted(), 2);
  ASSERT_TRUE(
      PushGrads(primary, {std::vector<float>(6, -0.5f), {1.0f, 1.0f, 1.0f}}, 2, &resp).ok());
  EXPECT_EQ(primary.forward_totals().owed, 0);
  EXPECT_TRUE(std::isnan(Values(primary, "b")[1]));
  for (const char* name : {"a", "b"}) {
    EXPECT_EQ(Bytes(backup, name), Bytes(primary, name)) << name;
    EXPECT_EQ(Updates(backup, name), 2) << name;
  }
  const absl::Status worker = PushGrads(backup, {std::vector<float>(6, nan), {0, 0, 0}}, 3, &resp);
  EXPECT_EQ(worker.code(), absl::StatusCode::kInvalidArgument) << worker;
  EXPECT_THAT(std::string(worker.message()), HasSubstr("NaN and Inf gradients are refused"));
  EXPECT_EQ(Updates(backup, "a"), 2);
}

// A store not created with replication 2 numbers none of its pushes, so a copy could not tell
// which pushes it holds: it refuses, and its shard keeps no backup.
TEST(ReplicationTest, AStoreWithoutReplicationRefusesCopiesForANewBackup) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  v1::CreateShardsRequest req;
  *req.add_dense() = AdamShard("a", 6, 1);
  v1::CreateShardsResponse created;
  ASSERT_TRUE(primary.CreateShards(req, &created).ok());  // (no replication)
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(primary, {"a"}, 1, &resp).ok());
  v1::ShardRef a;
  a.set_variable("a");
  v1::DenseReplica copy;
  const absl::Status s = primary.CopyForNewBackup(a, 1, &copy);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not created with replication 2"));
  v1::InspectShardRequest inspect;
  inspect.mutable_shard()->set_variable("a");
  absl::StatusOr<v1::InspectShardResponse> shard = primary.Inspect(inspect);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_FALSE(shard->shard().has_backup_ps_task());  // no backup set
  ASSERT_TRUE(Push(primary, {"a"}, 2, &resp).ok());
  EXPECT_EQ(forwarder.calls(), 0);  // nothing forwarded: no backup was set
  EXPECT_EQ(Updates(primary, "a"), 2);
}

TEST(ReplicationTest, ACopyForANewBackupRefusesWhatDoesNotFitAndChangesNothing) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup{ParameterStoreOptions()};
  CreateBoth(primary, backup);
  forwarder.ApplyTo(&backup);
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(primary, {"a", "b"}, 1, &resp).ok());
  v1::DenseReplica copy;
  v1::ShardRef ref;
  ref.set_variable("nope");
  absl::Status s = primary.CopyForNewBackup(ref, 1, &copy);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  ref.set_variable("a");
  // Its backup, ps:1, is alive: a second one would leave it behind.
  s = primary.CopyForNewBackup(ref, 2, &copy);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("backed up on ps:1 already"));
  s = primary.CopyForNewBackup(ref, -1, &copy);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // The same backup again (a retry) is a copy.
  ASSERT_TRUE(primary.CopyForNewBackup(ref, 1, &copy).ok());
  EXPECT_EQ(copy.updates(), 1);
  const std::vector<float> before = Values(backup, "a");
  v1::DenseReplica cut = copy;
  cut.set_updates(5);
  cut.mutable_values_and_slots()->resize(copy.values_and_slots().size() - 4);
  bool installed = true;
  s = backup.InstallReplica(cut, &installed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("a copy of ", cut.values_and_slots().size(),
                                                  " bytes for a shard whose values and slots take ",
                                                  copy.values_and_slots().size())));
  EXPECT_FALSE(installed);
  cut = copy;
  cut.set_updates(-1);
  s = backup.InstallReplica(cut, &installed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  cut.mutable_shard()->set_variable("nope");
  s = backup.InstallReplica(cut, &installed);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(Values(backup, "a"), before);
  EXPECT_EQ(Updates(backup, "a"), 1);
  ExpectSameAs(backup, primary);
}

// Tables (async): a table of Adagrad rows (whose result depends on the order of a row's
// updates), in 4 virtual shards, all held.
v1::TableShardSpec EmbSpec() {
  v1::TableShardSpec t;
  t.mutable_table()->set_name("emb");
  t.mutable_table()->set_dim(4);
  t.mutable_table()->mutable_initializer()->set_kind(v1::InitializerSpec::UNIFORM);
  t.mutable_table()->mutable_initializer()->set_min(-1);
  t.mutable_table()->mutable_initializer()->set_max(1);
  t.mutable_table()->mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
  t.set_num_virtual_shards(4);
  for (int v = 0; v < 4; ++v) t.add_virtual_shards(v);
  return t;
}

// The table on a primary with every virtual shard backed up on ps:1, and on that backup.
void CreateTables(ParameterStore& primary, ParameterStore& backup, const v1::TableShardSpec& spec) {
  v1::CreateShardsRequest req;
  v1::TableShardSpec* t = req.add_tables();
  *t = spec;
  v1::CreateShardsResponse resp;
  ASSERT_TRUE(backup.CreateShards(req, &resp).ok());
  for (int v = 0; v < 4; ++v) t->add_virtual_shard_backups(1);
  req.set_replication(2);
  ASSERT_TRUE(primary.CreateShards(req, &resp).ok());
}

// Push i of client c: 30 keys of 0..99 (one repeated), gradients that differ per push.
absl::Status PushRows(ParameterStore& store, int c, int i, v1::PushSparseResponse* resp) {
  v1::PushSparseRequest req;
  req.set_table("emb");
  req.set_worker(c);
  req.mutable_request_id()->set_client(100 + c);
  req.mutable_request_id()->set_seq(i);
  std::vector<int64_t> keys;
  for (int k = 0; k < 30; ++k) keys.push_back((k * 7 + i * 13 + c * 3) % 100);
  keys.push_back(keys.front());
  std::vector<float> grads(keys.size() * 4);
  for (size_t j = 0; j < grads.size(); ++j) {
    grads[j] = 0.125f * static_cast<float>((j * 5 + i * 3 + c) % 9) - 0.5f;
  }
  req.set_gradients(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
  return store.PushSparse(req, keys.data(), static_cast<int64_t>(keys.size()), req.gradients(),
                          resp);
}

// The rows of keys 0..99 (those that exist) and the table's row count, as Inspect gives them.
std::pair<std::string, int64_t> Rows(ParameterStore& store) {
  v1::InspectShardRequest req;
  req.mutable_shard()->set_variable("emb");
  req.mutable_shard()->set_partition(-1);  // a table
  for (int64_t k = 0; k < 100; ++k) req.add_keys(k);
  absl::StatusOr<v1::InspectShardResponse> r = store.Inspect(req);
  CHECK(r.ok()) << r.status();
  return {r->found_rows(), r->shard().rows()};
}

// Rebuild of a table's backup (RebuildBackup with tables), Adam (whose update counts and
// slots the copies must carry): ps:1 died before any push, so nothing was numbered for it.
// Four clients push on until the rebuild is over, and ten pushes go in when half the stripes
// are copied (their groups of those stripes forwarded, the rest in the later copies): the new
// incarnation's part ends bit for bit its primary's. Lost again and rebuilt again onto the same
// part, behind ten pushes applied while it was off, it is again. Promoted, it answers a retry
// of a push applied before the copies as a duplicate.
TEST(ReplicationTest, ATablesNewBackupCopiedStripeByStripeWhilePushesGoOnEndsEqualToItsPrimary) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  v1::TableShardSpec adam = EmbSpec();
  adam.mutable_table()->mutable_optimizer()->mutable_adam()->set_learning_rate(0.05f);
  {
    ParameterStore died{ParameterStoreOptions()};
    CreateTables(primary, died, adam);
    primary.DropBackup(1);
  }
  v1::PushSparseResponse resp;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(PushRows(primary, 9, i, &resp).ok());
  EXPECT_EQ(forwarder.calls(), 0);                // nothing forwarded while ps:1 was gone
  ParameterStore fresh{ParameterStoreOptions()};  // ps:1's new incarnation
  {
    v1::CreateShardsRequest req;
    *req.add_tables() = adam;
    v1::CreateShardsResponse created;
    ASSERT_TRUE(fresh.CreateShards(req, &created).ok());
  }
  forwarder.ApplyTo(&fresh);
  std::atomic<int> started{0};
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 20 || !done.load(); ++i) {
        if (i == 1) ++started;
        v1::PushSparseResponse r;
        const absl::Status st = PushRows(primary, c, 100 + i, &r);
        if (!st.ok()) {
          ADD_FAILURE() << st;
          ++failures;
        }
      }
    });
  }
  int forwards_midway = 0;
  forwarder.AfterTableCopy([&](int stripe) {
    if (stripe != EmbeddingTable::kNumStripes / 2) return;
    const int before = forwarder.calls();
    for (int i = 0; i < 10; ++i) {
      v1::PushSparseResponse r;
      EXPECT_TRUE(PushRows(primary, 8, i, &r).ok());
    }
    forwards_midway = forwarder.calls() - before;
  });
  while (started.load() < 4) absl::SleepFor(absl::Milliseconds(1));
  v1::RebuildBackupRequest rebuild;
  rebuild.set_backup_ps_task(1);
  rebuild.add_tables("emb");
  v1::RebuildBackupResponse rebuilt;
  const absl::Status s = primary.RebuildBackup(rebuild, /*self=*/0, &rebuilt);
  ASSERT_TRUE(s.ok()) << s;
  done = true;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(rebuilt.tables_copied(), 1);
  EXPECT_GT(rebuilt.rows_copied(), 50);  // the rows of the 20 pushes before, at least
  EXPECT_EQ(forwarder.table_copies(), EmbeddingTable::kNumStripes + 1);  // and the ledger
  EXPECT_GT(forwards_midway, 0);  // the copied stripes' groups of those pushes were forwarded
  EXPECT_EQ(Rows(fresh), Rows(primary));  // bit for bit
  // And after more pushes, which take the copied slots and counts too.
  for (int i = 0; i < 10; ++i) {
    v1::PushSparseResponse r;
    ASSERT_TRUE(PushRows(primary, 7, i, &r).ok());
    EXPECT_FALSE(r.duplicate());
  }
  EXPECT_EQ(Rows(fresh), Rows(primary));
  // Lost again (its part kept, as for a rebuild tried again), ten pushes applied meanwhile,
  // then rebuilt again onto that part.
  primary.DropBackup(1);
  const int calls = forwarder.calls();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(PushRows(primary, 6, i, &resp).ok());
  EXPECT_EQ(forwarder.calls(), calls);  // nothing forwarded while it was off
  EXPECT_NE(Rows(fresh), Rows(primary));
  forwarder.AfterTableCopy(nullptr);
  rebuilt.Clear();
  const absl::Status again = primary.RebuildBackup(rebuild, /*self=*/0, &rebuilt);
  ASSERT_TRUE(again.ok()) << again;
  EXPECT_EQ(Rows(fresh), Rows(primary));
  for (int i = 10; i < 20; ++i) ASSERT_TRUE(PushRows(primary, 6, i, &resp).ok());
  EXPECT_EQ(Rows(fresh), Rows(primary));
  // Promoted, it answers a retry of a push applied before the copies as a duplicate.
  v1::PushSparseResponse retried;
  ASSERT_TRUE(PushRows(fresh, 9, 3, &retried).ok());
  EXPECT_TRUE(retried.duplicate());
  // A copy that names a key of another stripe is refused, and changes nothing.
  const auto before = Rows(fresh);
  v1::TableReplica bad;
  bad.set_table("emb");
  bad.set_stripe(0);
  bad.set_rows(1);
  // (A table of the same spec puts each key in the same stripe.)
  absl::StatusOr<std::unique_ptr<EmbeddingTable>> same =
      EmbeddingTable::Create(EmbSpec().table(), {0, 1, 2, 3}, 4);
  ASSERT_TRUE(same.ok());
  int64_t key = 0;
  while ((*same)->StripeOf(key) == 0) ++key;
  const int64_t count = 0;
  const std::vector<float> row(2 * 4, 0.5f);
  bool installed = false;
  const absl::Status refused = fresh.InstallTableReplica(bad, &key, &count, row.data(), &installed);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_FALSE(installed);
  EXPECT_EQ(Rows(fresh), before);
}

// As for dense shards: a table's backup takes the rows its primary applied, NaN included when
// the primary's --nan_policy let it through, whatever its own policy.
TEST(ReplicationTest, ATablesBackupTakesWhatItsPrimaryAppliedWhateverItsOwnNanPolicy) {
  DirectForwarder forwarder;
  ParameterStoreOptions allows = WithForwarder(&forwarder);
  allows.allow_non_finite = true;
  ParameterStore primary(allows);
  ParameterStoreOptions waits_briefly;
  waits_briefly.replica_wait = absl::Seconds(2);
  ParameterStore backup(waits_briefly);
  CreateTables(primary, backup);
  forwarder.ApplyTo(&backup);
  v1::PushSparseRequest req;
  req.set_table("emb");
  req.mutable_request_id()->set_client(100);
  req.mutable_request_id()->set_seq(1);
  const std::vector<int64_t> keys = {3, 17, 42};
  std::vector<float> grads(keys.size() * 4, 0.25f);
  grads[5] = std::numeric_limits<float>::infinity();  // key 17's second element
  req.set_gradients(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
  v1::PushSparseResponse resp;
  const absl::Status s = primary.PushSparse(req, keys.data(), 3, req.gradients(), &resp);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(primary.forward_totals().owed, 0);
  EXPECT_EQ(Rows(backup), Rows(primary));  // bit for bit, the non-finite row too
  ASSERT_TRUE(PushRows(primary, 0, 2, &resp).ok());
  EXPECT_EQ(Rows(backup), Rows(primary));
}

TEST(ReplicationTest, TableUpdatesReachTheBackupInEachRowsOrder) {
  DirectForwarder forwarder;
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup{ParameterStoreOptions()};
  CreateTables(primary, backup);
  forwarder.ApplyTo(&backup);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < 4; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; i < 25; ++i) {
        v1::PushSparseResponse resp;
        if (!PushRows(primary, c, i, &resp).ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const auto [rows, count] = Rows(primary);
  EXPECT_EQ(count, 100);
  EXPECT_EQ(Rows(backup).first, rows);  // bit for bit
  EXPECT_EQ(Rows(backup).second, count);
}

// The table form of the test above: push P of client 0 held between its apply and its
// forwards, push A of client 1 (rows in the same stripes, numbered after P's there) applied
// meanwhile with its forward failing. P's thread sends A's owed forward at the same time as its
// own, not before it (the backup would wait for P's groups in the stripes they share, and
// before, for A's, whichever order one thread chose): both reach the backup at once.
TEST(ReplicationTest, AnEarlierTablePushsForwardGoesBesideALaterPushsOwedOne) {
  HeldAfterItsFirstApply h(/*tables=*/true);
  DirectForwarder& forwarder = h.forwarder;
  ParameterStore& primary = h.primary;
  ParameterStore& backup = h.backup;

  absl::Status first;
  std::thread p = h.StartHeld(
      [&] {
        v1::PushSparseResponse resp;
        return PushRows(primary, 0, 1, &resp);
      },
      &first);
  forwarder.FailNext(1);
  v1::PushSparseResponse resp;
  EXPECT_EQ(PushRows(primary, 1, 1, &resp).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(primary.forward_totals().owed, 1);
  const absl::Time start = absl::Now();
  h.release.Notify();
  p.join();
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_LT(took, absl::Seconds(1)) << "P's forward waited behind A's owed one";
  EXPECT_EQ(primary.forward_totals().owed, 0);  // A's went with P's
  EXPECT_EQ(Rows(backup), Rows(primary));       // bit for bit
  // A's retry: a duplicate that owes nothing.
  ASSERT_TRUE(PushRows(primary, 1, 1, &resp).ok());
  EXPECT_TRUE(resp.duplicate());
  EXPECT_EQ(Rows(backup), Rows(primary));
}

// The table form of ARetryResendsOwedForwardsInTheirPushesOrder: push P of client 0 held
// between its apply and its forward while push A of client 1 (numbered after P in the stripes
// they share) is applied with its forward failing; then P's forward fails too, and so does
// A's, sent again beside it. Both are owed. P's retry sends them again, together: one after
// the other, in whichever order they were owed, the first would wait at the backup for the
// other's groups (3 s, its replica_wait) while the other waited behind it.
TEST(ReplicationTest, ARetryResendsOwedTableForwardsTogether) {
  HeldAfterItsFirstApply h(/*tables=*/true);
  DirectForwarder& forwarder = h.forwarder;
  ParameterStore& primary = h.primary;
  ParameterStore& backup = h.backup;

  absl::Status first;
  std::thread p = h.StartHeld(
      [&] {
        v1::PushSparseResponse resp;
        return PushRows(primary, 0, 1, &resp);
      },
      &first);
  forwarder.FailNext(1);
  v1::PushSparseResponse resp;
  EXPECT_EQ(PushRows(primary, 1, 1, &resp).code(), absl::StatusCode::kUnavailable);
  forwarder.FailNext(2);  // P's forward, and A's sent again with it
  h.release.Notify();
  p.join();
  EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
  EXPECT_EQ(primary.forward_totals().owed, 2);
  const absl::Time start = absl::Now();
  v1::PushSparseResponse retry;
  ASSERT_TRUE(PushRows(primary, 0, 1, &retry).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "an owed forward waited behind another";
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(primary.forward_totals().owed, 0);
  EXPECT_EQ(Rows(backup), Rows(primary));  // bit for bit
}

// Forwards each table forward to the store of its backup task.
class TableForwarder : public PushForwarder {
 public:
  explicit TableForwarder(std::map<int, ParameterStore*> backups) : backups_(std::move(backups)) {}
  absl::Status Forward(const ForwardList&) override {
    return absl::UnimplementedError("tables only");
  }
  absl::Status ForwardSparse(int backup, const v1::ReplicateSparseRequest& request) override {
    auto it = backups_.find(backup);
    if (it == backups_.end()) return absl::NotFoundError(absl::StrCat("no ps:", backup));
    forwards_.fetch_add(1);
    v1::ReplicateSparseResponse resp;
    return it->second->ApplyReplicatedSparse(request, &resp);
  }
  int forwards() const { return forwards_.load(); }

 private:
  const std::map<int, ParameterStore*> backups_;
  std::atomic<int> forwards_{0};
};

// Large pushes (sorted in blocks on the apply pool's threads) to a table whose virtual shards
// are backed up on two tasks: each backup ends with exactly the rows of its virtual shards, bit
// for bit the primary's.
TEST(ReplicationTest, LargeTablePushesReachEachOfTheirBackupsBitForBit) {
  v1::CreateShardsRequest req;
  v1::TableShardSpec* t = req.add_tables();
  *t = EmbSpec();
  v1::CreateShardsResponse resp;
  ParameterStoreOptions pooled;
  pooled.apply_threads = 3;
  ParameterStore backup1(pooled), backup2(pooled);
  ASSERT_TRUE(backup1.CreateShards(req, &resp).ok());
  ASSERT_TRUE(backup2.CreateShards(req, &resp).ok());
  // Virtual shards 0 and 2 on ps:1, 1 and 3 on ps:2.
  for (int b : {1, 2, 1, 2}) t->add_virtual_shard_backups(b);
  req.set_replication(2);
  TableForwarder forwarder({{1, &backup1}, {2, &backup2}});
  ParameterStoreOptions options = pooled;
  options.forwarder = &forwarder;
  ParameterStore primary(options);
  const absl::Status created = primary.CreateShards(req, &resp);
  ASSERT_TRUE(created.ok()) << created;
  constexpr int64_t kKeys = 40000, kSpace = 60000;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; i < 3; ++i) {
        v1::PushSparseRequest push;
        push.set_table("emb");
        push.set_worker(c);
        push.mutable_request_id()->set_client(200 + c);
        push.mutable_request_id()->set_seq(i);
        std::vector<int64_t> keys(kKeys);
        for (int64_t k = 0; k < kKeys; ++k) keys[k] = (k * 7919 + i * 101 + c * 13) % kSpace;
        keys[kKeys - 1] = keys[0];  // a repeated key
        std::vector<float> grads(keys.size() * 4);
        for (size_t j = 0; j < grads.size(); ++j) {
          grads[j] = 0.125f * static_cast<float>((j * 5 + i * 3 + c) % 9) - 0.5f;
        }
        push.set_gradients(
            std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
        v1::PushSparseResponse answer;
        if (!primary.PushSparse(push, keys.data(), kKeys, push.gradients(), &answer).ok()) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  EXPECT_EQ(forwarder.forwards(), 2 * 3 * 2);  // each push, to each backup
  // Every key's row, on the primary and on the backup of its virtual shard (if any).
  v1::InspectShardRequest ask;
  ask.mutable_shard()->set_variable("emb");
  ask.mutable_shard()->set_partition(-1);
  for (int64_t k = 0; k < kSpace; ++k) ask.add_keys(k);
  absl::StatusOr<v1::InspectShardResponse> p = primary.Inspect(ask);
  absl::StatusOr<v1::InspectShardResponse> b1 = backup1.Inspect(ask);
  absl::StatusOr<v1::InspectShardResponse> b2 = backup2.Inspect(ask);
  ASSERT_TRUE(p.ok() && b1.ok() && b2.ok());
  std::map<int64_t, std::string> on[3];  // primary, ps:1, ps:2
  const v1::InspectShardResponse* from[3] = {&*p, &*b1, &*b2};
  for (int s = 0; s < 3; ++s) {
    for (int j = 0; j < from[s]->found_keys_size(); ++j) {
      on[s][from[s]->found_keys(j)] = from[s]->found_rows().substr(j * 4 * 4, 4 * 4);
    }
  }
  ASSERT_GT(on[0].size(), 40000u);
  size_t backed = 0;
  for (const auto& [key, row] : on[0]) {
    const int v = VirtualShardOfTableKey(key, /*vocabulary_size=*/0, /*num_virtual_shards=*/4);
    const int b = v % 2 == 0 ? 1 : 2;
    ASSERT_EQ(on[b].count(key), 1u) << "key " << key << " is not on ps:" << b;
    EXPECT_EQ(on[b][key], row) << "key " << key << " on ps:" << b;
    EXPECT_EQ(on[3 - b].count(key), 0u) << "key " << key << " is on ps:" << 3 - b;
    ++backed;
  }
  EXPECT_EQ(on[1].size() + on[2].size(), backed);
}

TEST(ReplicationTest, TableForwardsThatArriveOutOfOrderAreAppliedInEachStripesOrder) {
  DirectForwarder forwarder;  // keeps the forwards
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStoreOptions waits_briefly;
  waits_briefly.replica_wait = absl::Seconds(5);
  ParameterStore backup(waits_briefly);
  CreateTables(primary, backup);
  for (int i = 0; i < 8; ++i) {
    v1::PushSparseResponse resp;
    ASSERT_TRUE(PushRows(primary, i % 2, i, &resp).ok());
  }
  std::vector<v1::ReplicateSparseRequest> kept = forwarder.kept_sparse();
  ASSERT_EQ(kept.size(), 8u);
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kept.size());
  for (int k = static_cast<int>(kept.size()) - 1; k >= 0; --k) {
    threads.emplace_back([&, k] {
      v1::ReplicateSparseResponse resp;
      results[k] = backup.ApplyReplicatedSparse(kept[k], &resp);
      if (results[k].ok()) EXPECT_EQ(resp.applied(), kept[k].groups_size());
    });
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Rows(backup).first, Rows(primary).first);
  // A forward sent again is not applied again; one whose groups do not add up is refused.
  v1::ReplicateSparseResponse again;
  ASSERT_TRUE(backup.ApplyReplicatedSparse(kept[3], &again).ok());
  EXPECT_EQ(again.applied(), 0);
  EXPECT_EQ(again.already_applied(), kept[3].groups_size());
  v1::ReplicateSparseRequest bad = kept[3];
  bad.mutable_groups(0)->set_count(bad.groups(0).count() + 1);
  absl::Status s = backup.ApplyReplicatedSparse(bad, &again);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("expected as many keys as the groups count"));
  EXPECT_EQ(Rows(backup).first, Rows(primary).first);
}

// After a failover the task that took the rows over may get the worker's retry of a push
// before that push's forward, which its dead primary sent earlier: the forward then changes
// nothing (the backup's ledger has the push), and the rows hold the push once.
TEST(ReplicationTest, AForwardOfAPushTheBackupTookFromItsWorkerIsNotAppliedAgain) {
  DirectForwarder forwarder;  // keeps the forwards
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup{ParameterStoreOptions()};
  CreateTables(primary, backup);
  v1::PushSparseResponse resp;
  ASSERT_TRUE(PushRows(primary, 0, 1, &resp).ok());
  std::vector<v1::ReplicateSparseRequest> kept = forwarder.kept_sparse();
  ASSERT_EQ(kept.size(), 1u);
  ASSERT_TRUE(PushRows(backup, 0, 1, &resp).ok());  // the retry, on the promoted store
  EXPECT_FALSE(resp.duplicate());
  v1::ReplicateSparseResponse late;
  ASSERT_TRUE(backup.ApplyReplicatedSparse(kept[0], &late).ok());
  EXPECT_EQ(late.applied(), 0);
  EXPECT_EQ(Rows(backup).first, Rows(primary).first);
}

// Two table pushes from two workers applied on a primary that keeps their forwards, and a
// backup that waits briefly for a group's turn: the second push's forward, applied alone, has
// groups of stripes the first push had (number 2: they wait in vain) and of stripes it had not
// (number 1: applied at once).
class PartialForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CreateTables(primary_, backup_);
    v1::PushSparseResponse resp;
    ASSERT_TRUE(PushRows(primary_, 0, 0, &resp).ok());
    ASSERT_TRUE(PushRows(primary_, 1, 1, &resp).ok());
    kept_ = forwarder_.kept_sparse();
    ASSERT_EQ(kept_.size(), 2u);
    int waiting = 0, ready = 0;
    for (const v1::SparseStripeGroup& g : kept_[1].groups())
      (g.sequence() == 1 ? ready : waiting)++;
    ASSERT_GT(waiting, 0);
    ASSERT_GT(ready, 0);
    const std::string before = Rows(backup_).first;
    v1::ReplicateSparseResponse r;
    absl::Status s = backup_.ApplyReplicatedSparse(kept_[1], &r);
    ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    ASSERT_NE(Rows(backup_).first, before);  // the ready groups were applied
  }

  static ParameterStoreOptions WaitsBriefly() {
    ParameterStoreOptions options;
    options.replica_wait = absl::Milliseconds(100);
    return options;
  }

  DirectForwarder forwarder_;  // keeps the forwards
  ParameterStore primary_{WithForwarder(&forwarder_)};
  ParameterStore backup_{WaitsBriefly()};
  std::vector<v1::ReplicateSparseRequest> kept_;
};

// The primary died: the worker's retry of the partly forwarded push on the backup, promoted
// since, applies only the other stripes' rows, and a forward sent late changes nothing more:
// each push is in the rows exactly once, in each row's order, so the rows are the primary's bit
// for bit.
TEST_F(PartialForwardTest, TheWorkersRetryAppliesOnlyWhatTheForwardDidNot) {
  v1::PushSparseResponse resp;
  ASSERT_TRUE(PushRows(backup_, 0, 0, &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  ASSERT_TRUE(PushRows(backup_, 1, 1, &resp).ok());
  EXPECT_FALSE(resp.duplicate());
  EXPECT_EQ(Rows(backup_).first, Rows(primary_).first);
  // Late forwards, and retries answered again, change nothing.
  for (const v1::ReplicateSparseRequest& f : kept_) {
    v1::ReplicateSparseResponse r;
    ASSERT_TRUE(backup_.ApplyReplicatedSparse(f, &r).ok());
    EXPECT_EQ(r.applied(), 0);
  }
  ASSERT_TRUE(PushRows(backup_, 1, 1, &resp).ok());
  EXPECT_TRUE(resp.duplicate());
  EXPECT_EQ(Rows(backup_).first, Rows(primary_).first);
}

// The primary did not die: the forward it sends again once the group it waited for came applies
// the groups the first attempt did not, once.
TEST_F(PartialForwardTest, TheForwardSentAgainAppliesTheRest) {
  v1::ReplicateSparseResponse r;
  ASSERT_TRUE(backup_.ApplyReplicatedSparse(kept_[0], &r).ok());
  ASSERT_TRUE(backup_.ApplyReplicatedSparse(kept_[1], &r).ok());
  EXPECT_GT(r.applied(), 0);
  EXPECT_GT(r.already_applied(), 0);
  EXPECT_EQ(Rows(backup_).first, Rows(primary_).first);
}

// After a failover the task that took shards over serves them from their backup store, found
// without BackupStores' lock; also when that store was made only after the promotion.
TEST(ReplicationTest, PromotedStoresAreServedWhicheverCameFirst) {
  BackupStores held{ParameterStoreOptions()};
  const auto backups_of = [](int primary, const std::string& name) {
    v1::CreateShardsRequest req;
    v1::BackupShards* b = req.add_backups();
    b->set_primary_ps_task(primary);
    *b->add_dense() = AdamShard(name, 4, 0);
    return req;
  };
  v1::CreateShardsResponse created;
  ASSERT_TRUE(held.Create(1, backups_of(0, "a"), &created).ok());
  v1::ShardRef a, b;
  a.set_variable("a");
  b.set_variable("b");
  EXPECT_EQ(held.ServingDense(a), nullptr);  // a backup, not served
  int dense = 0;
  bool already = false;
  held.Promote(0, &dense, &already);
  EXPECT_EQ(dense, 1);
  EXPECT_EQ(held.ServingDense(a), held.Find(0));
  // ps:2 is failed over before this task was told it backs up b of ps:2.
  held.Promote(2, &dense, &already);
  EXPECT_EQ(dense, 0);
  EXPECT_EQ(held.ServingDense(b), nullptr);
  ASSERT_TRUE(held.Create(1, backups_of(2, "b"), &created).ok());
  EXPECT_EQ(held.ServingDense(b), held.Find(2));
  EXPECT_EQ(held.ServingDense(a), held.Find(0));
  EXPECT_EQ(held.Promoted().size(), 2u);
}

// The value of `name`'s series whose label `key` is `value` (-1 when there is none).
double Series(const std::vector<prometheus::MetricFamily>& families, const std::string& name,
              const std::string& key, const std::string& value) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == key && l.value == value) {
          return f.type == prometheus::MetricType::Gauge ? m.gauge.value : m.counter.value;
        }
      }
    }
  }
  return -1;
}

// Has `held`, on ps:1, hold `backups` of ps:0's shards; returns their store (null, with a
// failure, when it could not).
ParameterStore* HoldForPs0(BackupStores& held, v1::BackupShards backups) {
  v1::CreateShardsRequest req;
  backups.set_primary_ps_task(0);
  *req.add_backups() = std::move(backups);
  v1::CreateShardsResponse created;
  const absl::Status s = held.Create(1, req, &created);
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? held.Find(0) : nullptr;
}

// Prometheus shows how far a table's backup is behind: the groups its primary numbered for it
// against those it applied.
TEST(ReplicationTest, PrometheusShowsWhatATablesBackupHasApplied) {
  DirectForwarder forwarder;  // keeps the forwards
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore unused{ParameterStoreOptions()};
  CreateTables(primary, unused);
  // ps:1 backs up every virtual shard of ps:0's table.
  BackupStores held{ParameterStoreOptions()};
  v1::BackupShards table;
  *table.add_tables() = EmbSpec();
  ParameterStore* backup = HoldForPs0(held, table);
  ASSERT_NE(backup, nullptr);
  for (int i = 0; i < 3; ++i) {
    v1::PushSparseResponse resp;
    ASSERT_TRUE(PushRows(primary, 0, i, &resp).ok());
  }
  std::vector<v1::ReplicateSparseRequest> kept = forwarder.kept_sparse();
  ASSERT_EQ(kept.size(), 3u);
  for (int k = 0; k < 2; ++k) {
    v1::ReplicateSparseResponse r;
    ASSERT_TRUE(backup->ApplyReplicatedSparse(kept[k], &r).ok());
  }
  BackupStores none{ParameterStoreOptions()};
  ParameterStore own1{ParameterStoreOptions()};
  const int sent = kept[0].groups_size() + kept[1].groups_size() + kept[2].groups_size();
  const int applied = kept[0].groups_size() + kept[1].groups_size();
  EXPECT_EQ(Series(PsMetricFamilies(primary, &none), "pscluster_ps_table_groups_forwarded_total",
                   "backup", "ps:1"),
            sent);
  EXPECT_EQ(Series(PsMetricFamilies(own1, &held), "pscluster_ps_table_groups_applied_total",
                   "primary", "ps:0"),
            applied);
}

// Prometheus shows how far a dense shard's backup is behind: the updates its primary applied
// against those the backup did, shard by shard; shards without a backup are not listed.
TEST(ReplicationTest, PrometheusShowsWhatADenseShardsBackupHasApplied) {
  DirectForwarder forwarder;  // keeps the forwards
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore unreplicated{ParameterStoreOptions()};
  CreateBoth(primary, unreplicated);
  // ps:1 holds the backups of ps:0's shards.
  BackupStores held{ParameterStoreOptions()};
  v1::BackupShards dense;
  *dense.add_dense() = AdamShard("a", 6, 1);
  *dense.add_dense() = AdamShard("b", 3, 1);
  ParameterStore* backup = HoldForPs0(held, dense);
  ASSERT_NE(backup, nullptr);
  for (int i = 0; i < 3; ++i) {
    v1::PushDenseResponse resp;
    ASSERT_TRUE(Push(primary, {"a"}, 1 + i, &resp).ok());
  }
  std::vector<DenseForward> kept = forwarder.kept();
  ASSERT_EQ(kept.size(), 3u);
  for (int k = 0; k < 2; ++k) {
    v1::ReplicateResponse r;
    ASSERT_TRUE(ApplyForward(*backup, kept[k], &r).ok());
  }
  BackupStores none{ParameterStoreOptions()};
  ParameterStore own1{ParameterStoreOptions()};
  const std::vector<prometheus::MetricFamily> on_primary = PsMetricFamilies(primary, &none);
  EXPECT_EQ(Series(on_primary, "pscluster_ps_shard_updates", "variable", "a"), 3);
  EXPECT_EQ(Series(on_primary, "pscluster_ps_shard_updates", "variable", "b"), 0);
  EXPECT_EQ(Series(on_primary, "pscluster_ps_shard_updates", "backup", "ps:1"), 3);
  const std::vector<prometheus::MetricFamily> on_backup = PsMetricFamilies(own1, &held);
  EXPECT_EQ(Series(on_backup, "pscluster_ps_backup_shard_updates", "variable", "a"), 2);
  EXPECT_EQ(Series(on_backup, "pscluster_ps_backup_shard_updates", "state", "backup"), 2);
  EXPECT_EQ(Series(on_backup, "pscluster_ps_backup_shard_updates", "primary", "ps:0"), 2);
  // A store whose shards have no backup lists none.
  EXPECT_EQ(
      Series(PsMetricFamilies(unreplicated, &none), "pscluster_ps_shard_updates", "variable", "a"),
      -1);
}

TEST(ReplicationTest, ABackupRefusesForwardsThatDoNotFitItsCopy) {
  DirectForwarder forwarder;  // keeps the forwards
  ParameterStoreOptions options;
  options.replica_wait = absl::Milliseconds(100);
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup(options);
  CreateBoth(primary, backup);
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(primary, {"a"}, 1, &resp).ok());
  ASSERT_TRUE(Push(primary, {"a", "b"}, 2, &resp).ok());
  std::vector<DenseForward> kept = forwarder.kept();
  ASSERT_EQ(kept.size(), 2u);

  // The second alone: its update before never comes.
  v1::ReplicateResponse r;
  absl::Status s = ApplyForward(backup, kept[1], &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("for the updates before 2 of backup a/0"));
  // Both in order; then one that the backup had on one shard and not on the other.
  ASSERT_TRUE(ApplyForward(backup, kept[0], &r).ok());
  ASSERT_TRUE(ApplyForward(backup, kept[1], &r).ok());
  v1::ReplicateResponse none;
  DenseForward diverged = kept[1];
  diverged.header.set_versions(0, 1);  // applied
  diverged.header.set_versions(1, 2);  // not yet: b has had 1
  s = ApplyForward(backup, diverged, &none);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("this backup has diverged from its primary"));
  // A header whose versions do not match its shards.
  DenseForward short_header = kept[1];
  short_header.header.mutable_versions()->RemoveLast();
  s = ApplyForward(backup, short_header, &none);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("names 2 shards but gives 1 versions"));
  // Nothing of those changed the backup: still the primary's copy.
  ExpectSameAs(backup, primary);
}

// Sync steps: the backup's accumulators take the gradients in the primary's order, so that
// they sum them as the primary did. Three workers whose gradients' sum in doubles depends on
// the order (1e30 + 1 - 1e30 is 0 one way and 1 another), forwards applied newest first.
TEST(ReplicationTest, SyncGradientsAreSummedOnTheBackupInThePrimarysOrder) {
  DirectForwarder forwarder;  // keeps the forwards
  ParameterStore primary(WithForwarder(&forwarder));
  ParameterStore backup{ParameterStoreOptions()};
  v1::CreateShardsRequest req;
  *req.add_dense() = AdamShard("a", 6, 1);
  *req.add_dense() = AdamShard("b", 3, 1);
  req.mutable_sync()->set_mode(v1::SYNC);
  req.mutable_sync()->set_replicas_to_aggregate(3);
  v1::CreateShardsResponse created;
  v1::CreateShardsRequest as_primary = req;
  as_primary.set_replication(2);
  ASSERT_TRUE(primary.CreateShards(as_primary, &created).ok());
  ASSERT_TRUE(backup.CreateShards(req, &created).ok());

  const float big[3] = {1e30f, 1.0f, -1e30f};
  // Each step's workers in another order on the primary: step 0 sums 1e30 - 1e30 + 1 (1),
  // step 1 2 + 2e30 - 2e30 (0); arrival order newest first would give 0 and 2.
  const int order[2][3] = {{0, 2, 1}, {1, 0, 2}};
  for (int step = 0; step < 2; ++step) {
    for (int k = 0; k < 3; ++k) {
      const int worker = order[step][k];
      v1::PushDenseHeader header;
      header.set_step(step);
      header.set_worker(worker);
      header.mutable_request_id()->set_client(100 + worker);
      header.mutable_request_id()->set_seq(1 + step);
      std::vector<std::vector<float>> grads;
      for (const char* name : {"a", "b"}) {
        header.add_shards()->set_variable(name);
        const int64_t n = name[0] == 'a' ? 6 : 3;
        header.add_num_elements(n);
        grads.emplace_back(n, big[worker] * (step + 1));
      }
      DensePush push;
      ASSERT_TRUE(primary.StartPushDense(header, &push).ok());
      for (int i = 0; i < 2; ++i) {
        ASSERT_TRUE(push.AddChunk(i, 0,
                                  absl::string_view(reinterpret_cast<const char*>(grads[i].data()),
                                                    grads[i].size() * sizeof(float)))
                        .ok());
      }
      v1::PushDenseResponse resp;
      ASSERT_TRUE(primary.FinishPushDense(&push, &resp).ok());
      EXPECT_EQ(resp.accepted(), 2);
    }
  }
  // A gradient for a step already complete is dropped and owes the backup nothing.
  const size_t before_stale = forwarder.kept().size();
  {
    v1::PushDenseHeader header;
    header.set_step(0);
    header.set_worker(0);
    header.mutable_request_id()->set_client(100);
    header.mutable_request_id()->set_seq(9);
    header.add_shards()->set_variable("b");
    header.add_num_elements(3);
    const std::vector<float> g(3, 5.0f);
    DensePush push;
    ASSERT_TRUE(primary.StartPushDense(header, &push).ok());
    ASSERT_TRUE(
        push.AddChunk(0, 0, absl::string_view(reinterpret_cast<const char*>(g.data()), 12)).ok());
    v1::PushDenseResponse resp;
    ASSERT_TRUE(primary.FinishPushDense(&push, &resp).ok());
    EXPECT_EQ(resp.dropped_stale(), 1);
  }
  EXPECT_EQ(forwarder.kept().size(), before_stale);

  std::vector<DenseForward> kept = forwarder.kept();
  ASSERT_EQ(kept.size(), 6u);
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kept.size());
  for (int k = static_cast<int>(kept.size()) - 1; k >= 0; --k) {
    threads.emplace_back([&, k] {
      v1::ReplicateResponse resp;
      results[k] = ApplyForward(backup, kept[k], &resp);
      if (results[k].ok()) EXPECT_EQ(resp.applied(), 2);
    });
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  // A forward sent again is not taken again.
  v1::ReplicateResponse again;
  ASSERT_TRUE(ApplyForward(backup, kept[4], &again).ok());
  EXPECT_EQ(again.applied(), 0);
  EXPECT_EQ(again.already_applied(), 2);

  // Both settle step 1's mean as a pull for step 2 would: the same bytes.
  class Discard : public DensePullSink {
    absl::Status Begin(const std::vector<int64_t>&) override { return absl::OkStatus(); }
    absl::Status Values(int, const float*, int64_t) override { return absl::OkStatus(); }
  };
  for (ParameterStore* store : {&primary, &backup}) {
    v1::PullDenseRequest pull;
    pull.add_shards()->set_variable("a");
    pull.add_shards()->set_variable("b");
    pull.set_step(2);
    Discard sink;
    ASSERT_TRUE(store->PullDense(pull, &sink).ok());
  }
  for (const char* name : {"a", "b"}) {
    EXPECT_EQ(Values(backup, name), Values(primary, name)) << name;  // bit for bit
  }
}

}  // namespace
}  // namespace pscluster
