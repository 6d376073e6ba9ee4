#include "client/parameter_client.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/row_length.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "sharding/partitioner.h"
#include "sharding/placement.h"
#include "sharding/sparse_hash.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<ParameterClient>> ParameterClient::Create(
    const v1::ModelSpec& model, const v1::Placement& placement,
    std::unique_ptr<PsTransport> transport, const ParameterClientOptions& options) {
  if (placement.num_ps() != transport->num_ps()) {
    return absl::InvalidArgumentError(absl::StrCat("the placement is for ", placement.num_ps(),
                                                   " ps tasks but ", transport->num_ps(),
                                                   " are reachable"));
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts must be at least 1, got ", options.max_attempts));
  }
  auto client = std::unique_ptr<ParameterClient>(
      new ParameterClient(model, placement, std::move(transport), options));
  for (const v1::VariableSpec& v : model.variables()) {
    DenseVar& var = client->dense_[v.name()];
    int64_t row_elements = 1;
    for (int i = 1; i < v.shape().dims_size(); ++i) row_elements *= v.shape().dims(i);
    var.num_elements = v.shape().dims_size() == 0 ? 1 : v.shape().dims(0) * row_elements;
  }
  for (const v1::DensePartition& p : placement.partitions()) {
    auto it = client->dense_.find(p.variable());
    if (it == client->dense_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the placement has partition ", p.partition(),
                                                     " of ", p.variable(),
                                                     ", which is not in the model"));
    }
    const v1::VariableSpec* spec = nullptr;
    for (const v1::VariableSpec& v : model.variables()) {
      if (v.name() == p.variable()) spec = &v;
    }
    const ElementRange elements = ElementsOf(p, RowElements(spec->shape()));
    Part part;
    part.ref.set_variable(p.variable());
    part.ref.set_partition(p.partition());
    part.ps = p.ps_task();
    part.backup = placement.options().replication() >= 2 ? p.backup_ps_task() : -1;
    part.offset = elements.begin;
    part.num_elements = elements.size;
    if (part.ps < 0 || part.ps >= placement.num_ps()) {
      return absl::InvalidArgumentError(absl::StrCat("partition ", p.partition(), " of ",
                                                     p.variable(), " is placed on ps:", part.ps,
                                                     " of ", placement.num_ps()));
    }
    it->second.parts.push_back(part);
  }
  for (const auto& [name, var] : client->dense_) {
    int64_t covered = 0;
    for (const Part& p : var.parts) covered += p.num_elements;
    if (covered != var.num_elements) {
      return absl::InvalidArgumentError(absl::StrCat("the placement's partitions of ", name,
                                                     " cover ", covered, " of its ",
                                                     var.num_elements, " elements"));
    }
  }
  return client;
}

namespace {

// The checkpoint's name, the last part of its directory: what a ps task with its own
// --checkpoint_dir resolves (storage/checkpoint_path.h).
std::string CheckpointName(const std::string& checkpoint_path) {
  std::string path = checkpoint_path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A random, non-zero id for this client's pushes: a restarted process is a new client.
uint64_t NewClientId() {
  std::random_device device;
  std::mt19937_64 rng((static_cast<uint64_t>(device()) << 32) ^ device() ^
                      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}

}  // namespace

ParameterClient::ParameterClient(v1::ModelSpec model, v1::Placement placement,
                                 std::unique_ptr<PsTransport> transport,
                                 const ParameterClientOptions& options)
    : model_(std::move(model)),
      placement_(std::move(placement)),
      transport_(std::move(transport)),
      options_(options),
      client_id_(NewClientId()) {
  const int threads =
      options.fan_out_threads > 0 ? options.fan_out_threads : std::max(0, transport_->num_ps() - 1);
  fan_out_ = std::make_unique<ThreadPool>(threads);
}

v1::RequestId ParameterClient::NextRequestId() {
  v1::RequestId id;
  id.set_client(client_id_);
  id.set_seq(next_seq_.fetch_add(1, std::memory_order_relaxed));
  return id;
}

absl::Status ParameterClient::WithRetries(int ps, const std::function<absl::Status()>& fn,
                                          bool push, int64_t routes) {
  absl::Duration backoff = options_.initial_backoff;
  auto retryable = [push](const absl::Status& s) {
    return s.code() == absl::StatusCode::kUnavailable ||
           (push && (s.code() == absl::StatusCode::kDeadlineExceeded ||
                     s.code() == absl::StatusCode::kCancelled));
  };
  for (int attempt = 1;; ++attempt) {
    if (cancelled_.HasBeenNotified()) {
      return absl::CancelledError(absl::StrCat("ps:", ps, ": the client is stopping"));
    }
    absl::Status s = fn();
    if (!retryable(s) || attempt >= options_.max_attempts) {
      if (!s.ok() && retryable(s)) {
        return absl::UnavailableError(
            absl::StrCat(s.message(), " (gave up after ", attempt, " attempts)"));
      }
      return s;
    }
    LOG(WARNING) << "ps:" << ps << " unavailable (attempt " << attempt << " of "
                 << options_.max_attempts << "), retrying in " << backoff << ": " << s.message();
    cancelled_.WaitForNotificationWithTimeout(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
    if (options_.before_retry && !cancelled_.HasBeenNotified()) options_.before_retry(ps);
    if (routes >= 0 && RoutesChanged(routes)) {
      return absl::AbortedError(absl::StrCat(
          "ps:", ps, " failed over while a call to it waited: planned again (", s.message(), ")"));
    }
    // (Not a routed call's: one to a lost task waits for the failover that re-plans it.)
    if (routes < 0 && options_.lost && options_.lost(ps)) {
      return absl::UnavailableError(absl::StrCat(s.message(), " (gave up after ", attempt,
                                                 " attempts: ps:", ps, " is lost)"));
    }
  }
}

void ParameterClient::Cancel() {
  std::call_once(cancel_once_, [this] {
    cancelled_.Notify();
    // And the attempts under way end now (a copy for a rebuild or a save may take minutes).
    for (int ps = 0; ps < num_ps(); ++ps) transport_->AbortCalls(ps);
  });
}

absl::Status ParameterClient::ForEachPs(const std::vector<int>& tasks,
                                        const std::function<absl::Status(int)>& fn, bool push,
                                        int64_t routes) {
  std::vector<absl::Status> results(tasks.size());
  // The first task runs on the calling thread: a call that touches one ps hands nothing off.
  fan_out_->ParallelFor(static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      results[i] = WithRetries(
          TaskOf(tasks[i]), [&] { return fn(tasks[i]); }, push, routes);
    }
  });
  for (const absl::Status& s : results) PS_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status ParameterClient::CreateAll(const v1::SyncOptions& sync, int64_t* created,
                                        const CreateShardsOptions& create,
                                        std::vector<int>* awaiting_restore) {
  std::vector<v1::CreateShardsRequest> requests(placement_.num_ps());
  for (v1::CreateShardsRequest& r : requests) {
    *r.mutable_sync() = sync;
    r.set_start_step(create.start_step);
    r.set_hold_until_restored(create.hold_until_restored);
    r.set_chief_epoch(options_.chief_epoch);
    r.set_replication(placement_.options().replication());
    r.mutable_ps_addresses()->Add(create.ps_addresses.begin(), create.ps_addresses.end());
  }
  std::vector<char> failed;  // empty: none failed over
  RoutesSnapshot(&failed);
  const auto failed_over = [&failed](int ps) { return !failed.empty() && failed[ps]; };
  std::map<std::string, const v1::VariableSpec*> vars;
  for (const v1::VariableSpec& v : model_.variables()) vars[v.name()] = &v;
  for (const v1::DensePartition& p : placement_.partitions()) {
    v1::DenseShardSpec* spec = requests[p.ps_task()].add_dense();
    *spec->mutable_variable() = *vars.at(p.variable());
    *spec->mutable_partition() = p;
  }
  for (const v1::TableSpec& t : model_.tables()) {
    std::vector<v1::TableShardSpec*> specs;
    for (int ps = 0; ps < placement_.num_ps(); ++ps) {
      v1::TableShardSpec* spec = requests[ps].add_tables();
      *spec->mutable_table() = t;
      spec->set_num_virtual_shards(placement_.virtual_shard_to_ps_size());
      specs.push_back(spec);
    }
    const std::vector<std::vector<int32_t>> owned = VirtualShardsByPs(placement_);
    const bool backed_up = placement_.virtual_shard_to_backup_ps_size() > 0;
    for (int ps = 0; ps < placement_.num_ps(); ++ps) {
      specs[ps]->mutable_virtual_shards()->Add(owned[ps].begin(), owned[ps].end());
      // Where the primary forwards each shard's updates (replication 2).
      for (int32_t v : owned[ps]) {
        if (backed_up)
          specs[ps]->add_virtual_shard_backups(placement_.virtual_shard_to_backup_ps(v));
      }
    }
  }
  if (placement_.options().replication() >= 2) AddBackups(failed, &requests);
  std::vector<int> all;
  for (int ps = 0; ps < placement_.num_ps(); ++ps) {
    if (!failed_over(ps)) all.push_back(ps);
  }
  std::vector<v1::CreateShardsResponse> responses(placement_.num_ps());
  PS_RETURN_IF_ERROR(ForEachPs(
      all, [&](int ps) { return transport_->CreateShards(ps, requests[ps], &responses[ps]); }));
  if (created != nullptr) {
    *created = 0;
    for (const v1::CreateShardsResponse& r : responses) *created += r.created();
  }
  if (awaiting_restore != nullptr) {
    awaiting_restore->clear();
    for (int ps = 0; ps < placement_.num_ps(); ++ps) {
      if (responses[ps].awaiting_restore()) awaiting_restore->push_back(ps);
    }
  }
  return absl::OkStatus();
}

void ParameterClient::AddBackups(const std::vector<char>& failed,
                                 std::vector<v1::CreateShardsRequest>* requests) const {
  // A failed-over primary's backups are promoted where they serve; one made again here (on a
  // task that restarted since) would hold initial values, and a later FailOverPs would promote
  // it as if it were a copy.
  const auto failed_over = [&failed](int ps) { return !failed.empty() && failed[ps]; };
  // (backup task, primary task) -> the entry of the backup task's request for that primary.
  std::map<std::pair<int, int>, v1::BackupShards*> entries;
  auto entry = [&](int backup, int primary) {
    v1::BackupShards*& e = entries[{backup, primary}];
    if (e == nullptr) {
      e = (*requests)[backup].add_backups();
      e->set_primary_ps_task(primary);
    }
    return e;
  };
  std::map<std::string, const v1::VariableSpec*> vars;
  for (const v1::VariableSpec& v : model_.variables()) vars[v.name()] = &v;
  for (const v1::DensePartition& p : placement_.partitions()) {
    if (failed_over(p.ps_task())) continue;
    v1::DenseShardSpec* spec = entry(p.backup_ps_task(), p.ps_task())->add_dense();
    *spec->mutable_variable() = *vars.at(p.variable());
    *spec->mutable_partition() = p;
  }
  const int num_virtual = placement_.virtual_shard_to_ps_size();
  for (const v1::TableSpec& t : model_.tables()) {
    std::map<std::pair<int, int>, v1::TableShardSpec*> specs;
    for (int v = 0; v < num_virtual && v < placement_.virtual_shard_to_backup_ps_size(); ++v) {
      if (failed_over(placement_.virtual_shard_to_ps(v))) continue;
      const std::pair<int, int> key{placement_.virtual_shard_to_backup_ps(v),
                                    placement_.virtual_shard_to_ps(v)};
      v1::TableShardSpec*& spec = specs[key];
      if (spec == nullptr) {
        spec = entry(key.first, key.second)->add_tables();
        *spec->mutable_table() = t;
        spec->set_num_virtual_shards(num_virtual);
      }
      spec->add_virtual_shards(v);
    }
  }
}

absl::StatusOr<std::vector<v1::SavedShard>> ParameterClient::SaveShards(
    const std::string& checkpoint_path, int64_t step, int64_t* bytes, v1::SavePhase phase,
    const std::string& delta_base, bool track_changes) {
  std::vector<v1::SaveShardsResponse> responses(placement_.num_ps());
  // A failed-over task holds nothing of its own; the tasks that took its shards over save
  // them, one failed over itself among them when it came back, had backups rebuilt onto it and
  // then took their partitions over.
  std::vector<char> failed;
  RoutesSnapshot(&failed);
  std::vector<char> serving(placement_.num_ps(), 0);
  for (int ps = 0; ps < placement_.num_ps(); ++ps) {
    serving[ps] = failed.empty() || !failed[ps];
  }
  for (const v1::DensePartition& p : placement_.partitions()) {
    if (!failed.empty() && failed[p.ps_task()] && p.backup_ps_task() >= 0) {
      serving[p.backup_ps_task()] = 1;
    }
  }
  std::vector<int> all;
  for (int ps = 0; ps < placement_.num_ps(); ++ps) {
    if (serving[ps]) all.push_back(ps);
  }
  PS_RETURN_IF_ERROR(ForEachPs(all, [&](int ps) {
    v1::SaveShardsRequest req;
    req.set_checkpoint_path(checkpoint_path);
    req.set_checkpoint(CheckpointName(checkpoint_path));
    req.set_step(step);
    req.set_ps_index(ps);
    req.set_chief_epoch(options_.chief_epoch);
    req.set_phase(phase);
    req.set_delta_base(delta_base);
    req.set_track_changes(track_changes);
    req.set_num_ps(placement_.num_ps());
    responses[ps].Clear();
    return transport_->SaveShards(ps, req, &responses[ps]);
  }));
  std::vector<v1::SavedShard> saved;
  *bytes = 0;
  for (const v1::SaveShardsResponse& r : responses) {
    saved.insert(saved.end(), r.shards().begin(), r.shards().end());
    *bytes += r.bytes();
  }
  return saved;
}

absl::Status ParameterClient::RestoreShards(const std::string& checkpoint_path,
                                            const std::vector<v1::SavedShard>& saved, int64_t step,
                                            const std::vector<int>* tasks,
                                            const std::vector<v1::CheckpointLink>& chain) {
  v1::RestoreShardsRequest req;
  req.mutable_chain()->Add(chain.begin(), chain.end());
  req.set_checkpoint_path(checkpoint_path);
  req.set_checkpoint(CheckpointName(checkpoint_path));
  req.mutable_saved()->Add(saved.begin(), saved.end());
  req.set_step(step);
  req.set_chief_epoch(options_.chief_epoch);
  std::vector<int> all;
  for (int ps = 0; ps < placement_.num_ps(); ++ps) all.push_back(ps);
  return ForEachPs(tasks != nullptr ? *tasks : all, [&](int ps) {
    v1::RestoreShardsResponse resp;
    return transport_->RestoreShards(ps, req, &resp);
  });
}

absl::StatusOr<const ParameterClient::DenseVar*> ParameterClient::FindVar(
    const std::string& name) const {
  auto it = dense_.find(name);
  if (it == dense_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown variable ", name, " (not in the model)"));
  }
  return &it->second;
}

absl::StatusOr<int64_t> ParameterClient::NumElements(const std::string& variable) const {
  PS_ASSIGN_OR_RETURN(const DenseVar* var, FindVar(variable));
  return var->num_elements;
}

int64_t ParameterClient::RoutesSnapshot(std::vector<char>* failed) const {
  if (routes_generation_.load() == 0) {  // never failed over: nothing to copy
    failed->clear();
    return 0;
  }
  absl::MutexLock lock(&routes_mu_);
  *failed = failed_over_;
  return routes_generation_.load();
}

absl::Status ParameterClient::SetFailedOver(const std::vector<int>& failed_over) {
  std::vector<char> failed(num_ps(), 0);
  for (int ps : failed_over) {
    if (ps < 0 || ps >= num_ps()) {
      return absl::InvalidArgumentError(
          absl::StrCat("failed-over task ps:", ps, " is not one of the ", num_ps(), " ps tasks"));
    }
    if (placement_.options().replication() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("ps:", ps, " failed over, but the placement has no backups (replication ",
                       placement_.options().replication(), ")"));
    }
    failed[ps] = 1;
  }
  if (failed_over.empty()) failed.clear();
  std::vector<int> newly;
  {
    absl::MutexLock lock(&routes_mu_);
    if (failed == failed_over_) return absl::OkStatus();
    for (int ps : failed_over) {
      if (failed_over_.empty() || !failed_over_[ps]) newly.push_back(ps);
    }
    failed_over_ = std::move(failed);
    routes_generation_.fetch_add(1);
  }
  // Calls under way to a task failed over just now end at once and are planned again (the
  // routes changed): one that hangs, frozen or cut off without a reset, would otherwise hold
  // them for the transport's I/O timeout.
  for (int ps : newly) transport_->AbortCalls(ps);
  return absl::OkStatus();
}

int64_t ParameterClient::TablePartsPerTable() const {
  std::vector<char> failed;
  RoutesSnapshot(&failed);
  if (failed.empty()) return num_ps();
  std::set<std::pair<int, int>> taken_over;  // (failed-over primary, the task that took over)
  int64_t live = 0;
  for (int ps = 0; ps < num_ps(); ++ps) live += failed[ps] ? 0 : 1;
  for (int v = 0; v < placement_.virtual_shard_to_ps_size() &&
                  v < placement_.virtual_shard_to_backup_ps_size();
       ++v) {
    const int primary = placement_.virtual_shard_to_ps(v);
    if (failed[primary]) taken_over.insert({primary, placement_.virtual_shard_to_backup_ps(v)});
  }
  return live + static_cast<int64_t>(taken_over.size());
}

std::vector<int> ParameterClient::failed_over() const {
  absl::MutexLock lock(&routes_mu_);
  std::vector<int> out;
  for (size_t ps = 0; ps < failed_over_.size(); ++ps) {
    if (failed_over_[ps]) out.push_back(static_cast<int>(ps));
  }
  return out;
}

absl::Status ParameterClient::FailOverPs(int ps, int failed, v1::FailOverPsResponse* response,
                                         int min_dense_shards, bool once) {
  v1::FailOverPsRequest request;
  request.set_min_dense_shards(min_dense_shards);
  request.set_failed_ps_task(failed);
  request.set_chief_epoch(options_.chief_epoch);
  if (once) return transport_->FailOverPs(ps, request, response);
  return WithRetries(ps, [&] { return transport_->FailOverPs(ps, request, response); });
}

absl::Status ParameterClient::RebuildBackupOnto(int backup, int primary,
                                                const v1::SyncOptions& sync,
                                                const CreateShardsOptions& create,
                                                int64_t* shards_copied, int64_t* bytes_copied,
                                                int64_t* rows_copied) {
  *shards_copied = 0;
  *bytes_copied = 0;
  if (rows_copied != nullptr) *rows_copied = 0;
  if (backup < 0 || backup >= num_ps() || primary < 0 || primary >= num_ps() || backup == primary ||
      placement_.options().replication() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("no backups of ps:", primary, " to rebuild on ps:", backup, " (", num_ps(),
                     " ps tasks, replication ", placement_.options().replication(), ")"));
  }
  v1::CreateShardsRequest create_request;
  *create_request.mutable_sync() = sync;
  create_request.set_start_step(create.start_step);
  create_request.set_chief_epoch(options_.chief_epoch);
  create_request.set_replication(placement_.options().replication());
  create_request.mutable_ps_addresses()->Add(create.ps_addresses.begin(),
                                             create.ps_addresses.end());
  v1::BackupShards* entry = create_request.add_backups();
  entry->set_primary_ps_task(primary);
  v1::RebuildBackupRequest rebuild;
  rebuild.set_backup_ps_task(backup);
  rebuild.set_chief_epoch(options_.chief_epoch);
  rebuild.mutable_ps_addresses()->Add(create.ps_addresses.begin(), create.ps_addresses.end());
  std::map<std::string, const v1::VariableSpec*> vars;
  for (const v1::VariableSpec& v : model_.variables()) vars[v.name()] = &v;
  for (const v1::DensePartition& p : placement_.partitions()) {
    if (p.backup_ps_task() != backup || p.ps_task() != primary) continue;
    v1::DenseShardSpec* spec = entry->add_dense();
    *spec->mutable_variable() = *vars.at(p.variable());
    *spec->mutable_partition() = p;
    v1::ShardRef* ref = rebuild.add_shards();
    ref->set_variable(p.variable());
    ref->set_partition(p.partition());
  }
  // And the rows of the tables' virtual shards the task backs up of the primary, each stripe
  // copied while pushes go on.
  const int num_virtual = placement_.virtual_shard_to_ps_size();
  for (const v1::TableSpec& t : model_.tables()) {
    v1::TableShardSpec* spec = nullptr;
    for (int v = 0; v < num_virtual && v < placement_.virtual_shard_to_backup_ps_size(); ++v) {
      if (placement_.virtual_shard_to_ps(v) != primary ||
          placement_.virtual_shard_to_backup_ps(v) != backup) {
        continue;
      }
      if (spec == nullptr) {
        spec = entry->add_tables();
        *spec->mutable_table() = t;
        spec->set_num_virtual_shards(num_virtual);
        rebuild.add_tables(t.name());
      }
      spec->add_virtual_shards(v);
    }
  }
  if (rebuild.shards().empty() && rebuild.tables().empty()) return absl::OkStatus();
  v1::CreateShardsResponse created;
  PS_RETURN_IF_ERROR(WithRetries(
      backup, [&] { return transport_->CreateShards(backup, create_request, &created); }));
  v1::RebuildBackupResponse response;
  PS_RETURN_IF_ERROR(
      WithRetries(primary, [&] { return transport_->RebuildBackup(primary, rebuild, &response); }));
  if (response.tables_copied() != rebuild.tables_size()) {
    // (A primary that does not copy tables yet answers without them.)
    return absl::FailedPreconditionError(absl::StrCat(
        "ps:", primary, " copied ", response.tables_copied(), " of the ", rebuild.tables_size(),
        " tables asked for onto ps:", backup, "; its table backups there are not rebuilt"));
  }
  *shards_copied = response.shards_copied();
  *bytes_copied = response.bytes_copied();
  if (rows_copied != nullptr) *rows_copied = response.rows_copied();
  return absl::OkStatus();
}

absl::Status ParameterClient::Pull(const std::vector<std::string>& variables,
                                   std::vector<std::vector<float>>* out, int64_t step) {
  out->resize(variables.size());
  std::vector<const DenseVar*> vars(variables.size());
  for (size_t i = 0; i < variables.size(); ++i) {
    PS_ASSIGN_OR_RETURN(vars[i], FindVar(variables[i]));
    (*out)[i].resize(vars[i]->num_elements);
  }
  // Planned again when a task fails over while the pull waits for it.
  std::vector<char> failed;
  for (;;) {
    const int64_t routes = RoutesSnapshot(&failed);
    std::map<int, std::vector<DenseSlice>> by_ps;
    for (size_t i = 0; i < vars.size(); ++i) {
      for (const Part& p : vars[i]->parts) {
        DenseSlice s;
        s.ref = p.ref;
        s.num_elements = p.num_elements;
        s.pull_into = (*out)[i].data() + p.offset;
        by_ps[RouteKey(p, failed)].push_back(s);
      }
    }
    std::vector<int> tasks;
    for (const auto& [key, slices] : by_ps) tasks.push_back(key);
    absl::Status s = ForEachPs(
        tasks,
        [&](int key) {
          return transport_->PullDense(TaskOf(key), by_ps.at(key), options_.wire_dtype, step);
        },
        /*push=*/false, routes);
    if (s.code() != absl::StatusCode::kAborted || !RoutesChanged(routes)) return s;
  }
}

absl::Status ParameterClient::PushDense(const std::vector<std::string>& variables,
                                        const std::vector<const float*>& grads, int64_t step,
                                        bool delta, PushTicket* ticket) {
  if (grads.size() != variables.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("push of ", variables.size(), " variables with ", grads.size(), " gradients"));
  }
  std::vector<const DenseVar*> vars(variables.size());
  for (size_t i = 0; i < variables.size(); ++i) {
    PS_ASSIGN_OR_RETURN(vars[i], FindVar(variables[i]));
  }
  // One id per store (a partition's primary), kept across its retries (and the ticket's later
  // attempts), also where a failover sends the store's partitions to their backups; a route
  // that answered an earlier attempt is not sent the push again.
  PushTicket local;
  if (ticket == nullptr) ticket = &local;
  std::vector<char> failed;
  for (;;) {
    const int64_t routes = RoutesSnapshot(&failed);
    std::map<int, std::vector<DenseSlice>> by_route;
    std::map<int, int> store_of;  // route key -> the partitions' primary
    for (size_t i = 0; i < vars.size(); ++i) {
      for (const Part& p : vars[i]->parts) {
        DenseSlice s;
        s.ref = p.ref;
        s.num_elements = p.num_elements;
        s.push_from = grads[i] + p.offset;
        const int key = RouteKey(p, failed);
        by_route[key].push_back(s);
        store_of[key] = p.ps;
      }
    }
    std::vector<int> keys;
    for (const auto& [key, slices] : by_route) {
      if (ticket->done.count(key) == 0) keys.push_back(key);
    }
    std::map<int, PushMeta> meta;
    for (int key : keys) {
      std::vector<v1::RequestId>& ids = ticket->ids[store_of.at(key)];
      if (ids.empty()) ids.push_back(NextRequestId());
      PushMeta& m = meta[key];
      m.wire_dtype = options_.wire_dtype;
      m.step = step;
      m.worker = options_.worker;
      m.request_id = ids[0];
      m.delta = delta;
    }
    std::map<int, std::atomic<bool>> answered;
    for (int key : keys) answered[key] = false;
    absl::Status s = ForEachPs(
        keys,
        [&](int key) {
          v1::PushDenseResponse resp;
          PS_RETURN_IF_ERROR(
              transport_->PushDense(TaskOf(key), by_route.at(key), meta.at(key), &resp));
          if (resp.duplicate()) duplicate_pushes_.fetch_add(1);
          answered.at(key) = true;
          return absl::OkStatus();
        },
        /*push=*/true, routes);
    for (int key : keys) {
      if (answered.at(key)) ticket->done.insert(key);
    }
    if (s.code() != absl::StatusCode::kAborted || !RoutesChanged(routes)) return s;
  }
}

absl::StatusOr<const v1::TableSpec*> ParameterClient::FindTable(const std::string& table) const {
  for (const v1::TableSpec& t : model_.tables()) {
    if (t.name() == table) return &t;
  }
  return absl::NotFoundError(absl::StrCat("unknown table ", table, " (not in the model)"));
}

namespace {

// Calls place(i, j) for every key i in [0, n): j is i's place in the grouped order, where the
// keys of task t take places [begin[t], begin[t + 1]) in increasing order of i. With two tasks
// the cursors stay in registers: the general loop's cursors in memory make each key wait for
// the store of the one before it to the same task.
template <typename Place>
void ForEachPlace(const int32_t* ps_of, const std::vector<int64_t>& begin, int64_t n, Place place) {
  const size_t num_ps = begin.size() - 1;
  if (num_ps == 1) {
    for (int64_t i = 0; i < n; ++i) place(i, i);
    return;
  }
  if (num_ps == 2) {
    int64_t first = 0, second = begin[1];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t q = ps_of[i];
      place(i, q != 0 ? second : first);
      first += 1 - q;
      second += q;
    }
    return;
  }
  std::vector<int64_t> next(begin.begin(), begin.end() - 1);
  for (int64_t i = 0; i < n; ++i) place(i, next[static_cast<size_t>(ps_of[i])]++);
}

}  // namespace

ParameterClient::KeyRoutes ParameterClient::RouteKeys(const v1::TableSpec& table,
                                                      const int64_t* keys, int64_t n) const {
  const int num_ps = placement_.num_ps();
  KeyRoutes routes;
  routes.begin.assign(static_cast<size_t>(num_ps) + 1, n);
  routes.begin[0] = 0;
  // One ps task owns every virtual shard: no key needs hashing (the ps still checks).
  if (num_ps == 1) return routes;
  const int32_t* owner = placement_.virtual_shard_to_ps().data();
  const int32_t num_virtual_shards = placement_.virtual_shard_to_ps_size();
  const int64_t vocabulary_size = table.vocabulary_size();
  routes.ps_of.reset(new int32_t[static_cast<size_t>(std::max<int64_t>(n, 1))]);
  int32_t* const ps_of = routes.ps_of.get();
  if (num_ps == 2) {
    // A sum, not counters in memory (see ForEachPlace).
    int64_t to_second = 0;
    for (int64_t i = 0; i < n; ++i) {
      ps_of[i] = owner[VirtualShardOfTableKey(keys[i], vocabulary_size, num_virtual_shards)];
      to_second += ps_of[i];
    }
    routes.begin[1] = n - to_second;
    return routes;
  }
  std::vector<int64_t> counts(static_cast<size_t>(num_ps), 0);
  for (int64_t i = 0; i < n; ++i) {
    ps_of[i] = owner[VirtualShardOfTableKey(keys[i], vocabulary_size, num_virtual_shards)];
    ++counts[static_cast<size_t>(ps_of[i])];
  }
  for (int ps = 0; ps < num_ps; ++ps) routes.begin[ps + 1] = routes.begin[ps] + counts[ps];
  return routes;
}

void ParameterClient::GroupPositions(int64_t n, KeyRoutes* routes) {
  routes->positions.reset(new int64_t[static_cast<size_t>(std::max<int64_t>(n, 1))]);
  int64_t* const positions = routes->positions.get();
  ForEachPlace(routes->ps_of.get(), routes->begin, n,
               [positions](int64_t i, int64_t j) { positions[j] = i; });
}

int64_t ParameterClient::KeysPerPart(int64_t dim) const {
  const int64_t by_bytes =
      options_.max_sparse_request_bytes / std::max<int64_t>(1, dim * int64_t{sizeof(float)});
  return std::max<int64_t>(1, std::min(options_.max_sparse_keys_per_request, by_bytes));
}

absl::Status ParameterClient::PullRows(const std::string& table, const int64_t* keys, int64_t n,
                                       float* out, int64_t step) {
  PS_ASSIGN_OR_RETURN(const v1::TableSpec* spec, FindTable(table));
  // Planned again when a task fails over while the pull waits for it.
  std::vector<char> failed;
  for (;;) {
    const int64_t routes = RoutesSnapshot(&failed);
    absl::Status s = failed.empty() ? PullRowsOwned(*spec, keys, n, out, step, routes)
                                    : PullRowsRouted(*spec, keys, n, out, step, failed, routes);
    if (s.code() != absl::StatusCode::kAborted || !RoutesChanged(routes)) return s;
  }
}

absl::Status ParameterClient::PushRows(const std::string& table, const int64_t* keys, int64_t n,
                                       const float* grads, int64_t step, PushTicket* ticket) {
  PS_ASSIGN_OR_RETURN(const v1::TableSpec* spec, FindTable(table));
  // The ids of every part of every primary's request, kept across attempts and replans.
  PushTicket local;
  if (ticket == nullptr) ticket = &local;
  std::vector<char> failed;
  for (;;) {
    const int64_t routes = RoutesSnapshot(&failed);
    absl::Status s = failed.empty()
                         ? PushRowsOwned(*spec, keys, n, grads, step, ticket, routes)
                         : PushRowsRouted(*spec, keys, n, grads, step, ticket, failed, routes);
    if (s.code() != absl::StatusCode::kAborted || !RoutesChanged(routes)) return s;
  }
}

ParameterClient::SparsePlan ParameterClient::PlanSparse(const v1::TableSpec& table,
                                                        const int64_t* keys, int64_t n,
                                                        const std::vector<char>& failed) const {
  SparsePlan plan;
  const int32_t num_virtual_shards = placement_.virtual_shard_to_ps_size();
  const int64_t per_part = KeysPerPart(table.dim());
  std::vector<int64_t> rank(static_cast<size_t>(num_ps()), 0);  // keys of each primary so far
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = VirtualShardOfTableKey(keys[i], table.vocabulary_size(), num_virtual_shards);
    const int primary = placement_.virtual_shard_to_ps(v);
    const int backup = v < placement_.virtual_shard_to_backup_ps_size()
                           ? placement_.virtual_shard_to_backup_ps(v)
                           : -1;
    const int route = failed[primary] && backup >= 0 ? num_ps() * (1 + primary) + backup : primary;
    const int part = static_cast<int>(rank[primary]++ / per_part);
    std::vector<SparsePart>& parts = plan.parts[route];
    if (parts.empty() || parts.back().part != part) parts.push_back(SparsePart{part, {}});
    parts.back().positions.push_back(i);
  }
  for (int ps = 0; ps < num_ps(); ++ps) {
    if (rank[ps] > 0) plan.num_parts[ps] = static_cast<int>((rank[ps] + per_part - 1) / per_part);
  }
  return plan;
}

absl::Status ParameterClient::PullRowsRouted(const v1::TableSpec& table, const int64_t* keys,
                                             int64_t n, float* out, int64_t step,
                                             const std::vector<char>& failed, int64_t routes) {
  const int64_t dim = table.dim();
  const SparsePlan plan = PlanSparse(table, keys, n, failed);
  std::vector<int> route_keys;
  for (const auto& [route, parts] : plan.parts) route_keys.push_back(route);
  return ForEachPs(
      route_keys,
      [&](int route) -> absl::Status {
        const int ps = TaskOf(route);
        for (const SparsePart& part : plan.parts.at(route)) {
          const int64_t count = static_cast<int64_t>(part.positions.size());
          std::vector<int64_t> my_keys(count);
          std::vector<float> rows(count * dim);
          GatherKeys(keys, part.positions.data(), count, my_keys.data());
          PS_RETURN_IF_ERROR(transport_->PullSparse(ps, table.name(), my_keys.data(), count, dim,
                                                    options_.wire_dtype, step, rows.data()));
          ScatterRows(rows.data(), part.positions.data(), count, dim, out);
        }
        return absl::OkStatus();
      },
      /*push=*/false, routes);
}

absl::Status ParameterClient::PushRowsRouted(const v1::TableSpec& table, const int64_t* keys,
                                             int64_t n, const float* grads, int64_t step,
                                             PushTicket* ticket, const std::vector<char>& failed,
                                             int64_t routes) {
  const int64_t dim = table.dim();
  const SparsePlan plan = PlanSparse(table, keys, n, failed);
  // Each primary's part ids as its first attempt drew them (or drawn now): a task that took
  // a failed-over primary's keys over recognises the parts that primary forwarded before it
  // died, and applies the others once.
  for (const auto& [primary, parts] : plan.num_parts) {
    std::vector<v1::RequestId>& ids = ticket->ids[primary];
    while (static_cast<int>(ids.size()) < parts) ids.push_back(NextRequestId());
  }
  std::vector<int> route_keys;
  for (const auto& [route, parts] : plan.parts) route_keys.push_back(route);
  return ForEachPs(
      route_keys,
      [&](int route) -> absl::Status {
        const int ps = TaskOf(route);
        const std::vector<v1::RequestId>& ids = ticket->ids.at(PrimaryOf(route));
        PushMeta meta;
        meta.wire_dtype = options_.wire_dtype;
        meta.step = step;
        meta.worker = options_.worker;
        meta.num_parts = static_cast<int32_t>(ids.size());
        for (const SparsePart& part : plan.parts.at(route)) {
          meta.part = part.part;
          meta.request_id = ids[part.part];
          v1::PushSparseResponse resp;
          PS_RETURN_IF_ERROR(WithRetries(
              ps,
              [&] {
                resp.Clear();
                return transport_->PushSparseGather(ps, table.name(), keys, part.positions.data(),
                                                    static_cast<int64_t>(part.positions.size()),
                                                    dim, grads, meta, &resp);
              },
              /*push=*/true, routes));
          if (resp.duplicate()) duplicate_pushes_.fetch_add(1);
        }
        return absl::OkStatus();
      },
      /*push=*/true, routes);
}

absl::Status ParameterClient::PullRowsOwned(const v1::TableSpec& spec, const int64_t* keys,
                                            int64_t n, float* out, int64_t step,
                                            int64_t generation) {
  const std::string& table = spec.name();
  const int64_t dim = spec.dim();
  KeyRoutes routes = RouteKeys(spec, keys, n);
  GroupPositions(n, &routes);
  std::vector<int> tasks;
  for (int ps = 0; ps < placement_.num_ps(); ++ps) {
    if (routes.size(ps) > 0) tasks.push_back(ps);
  }
  const int64_t per_part = KeysPerPart(dim);
  return ForEachPs(
      tasks,
      [&](int ps) -> absl::Status {
        const int64_t* pos = routes.of(ps);
        const int64_t m = routes.size(ps);
        if (m == n && m <= per_part) {
          return transport_->PullSparse(ps, table, keys, n, dim, options_.wire_dtype, step, out);
        }
        // Not value-initialized: every element is written before it is read.
        const int64_t most = std::min(m, per_part);
        std::unique_ptr<int64_t[]> my_keys(new int64_t[static_cast<size_t>(most)]);
        std::unique_ptr<float[]> rows(new float[static_cast<size_t>(most * dim)]);
        for (int64_t begin = 0; begin < m; begin += per_part) {
          const int64_t count = std::min(per_part, m - begin);
          GatherKeys(keys, pos + begin, count, my_keys.get());
          PS_RETURN_IF_ERROR(transport_->PullSparse(ps, table, my_keys.get(), count, dim,
                                                    options_.wire_dtype, step, rows.get()));
          ScatterRows(rows.get(), pos + begin, count, dim, out);
        }
        return absl::OkStatus();
      },
      /*push=*/false, generation);
}

absl::Status ParameterClient::PushRowsOwned(const v1::TableSpec& spec, const int64_t* keys,
                                            int64_t n, const float* grads, int64_t step,
                                            PushTicket* ticket, int64_t generation) {
  const std::string& table = spec.name();
  const int64_t dim = spec.dim();
  KeyRoutes routes = RouteKeys(spec, keys, n);
  std::vector<int> tasks;
  for (int ps = 0; ps < placement_.num_ps(); ++ps) {
    if (routes.size(ps) > 0) tasks.push_back(ps);
  }
  const int64_t per_part = KeysPerPart(dim);
  // The ids of every part of every ps request, drawn before anything is sent (or taken from
  // the ticket of an earlier attempt).
  std::map<int, std::vector<v1::RequestId>>& ids = ticket->ids;
  bool one_part_each = true;
  for (int ps : tasks) {
    const int64_t parts = (routes.size(ps) + per_part - 1) / per_part;
    while (static_cast<int64_t>(ids[ps].size()) < parts) ids[ps].push_back(NextRequestId());
    one_part_each = one_part_each && parts == 1;
  }
  // Split over several tasks, each in one request: one sequential pass copies every key and
  // row into its task's part, and each part is sent as it is. (Gathering each part from the
  // caller's arrays as it is sent reads every line of them once per task, and took the client
  // some 10 % more CPU per GB; docs/benchmarks_history.md, session 15.) Larger requests are
  // gathered part by part as they are sent, with no copy of the whole.
  std::unique_ptr<int64_t[]> part_keys;
  std::unique_ptr<float[]> part_rows;
  const bool split = tasks.size() > 1 && one_part_each;
  if (split) {
    part_keys.reset(new int64_t[static_cast<size_t>(n)]);
    part_rows.reset(new float[static_cast<size_t>(n * dim)]);
    int64_t* const to_keys = part_keys.get();
    float* const to_rows = part_rows.get();
    WithRowLength(dim, [&](auto d) {
      ForEachPlace(routes.ps_of.get(), routes.begin, n, [&](int64_t i, int64_t j) {
        to_keys[j] = keys[i];
        std::memcpy(to_rows + j * d, grads + i * d, static_cast<size_t>(d) * sizeof(float));
      });
    });
  } else if (tasks.size() > 1 || n > per_part) {
    GroupPositions(n, &routes);  // for the parts gathered as they are sent
  }
  return ForEachPs(
      tasks,
      [&](int ps) -> absl::Status {
        const int64_t m = routes.size(ps);
        const std::vector<v1::RequestId>& part_ids = ids.at(ps);
        PushMeta meta;
        meta.wire_dtype = options_.wire_dtype;
        meta.step = step;
        meta.worker = options_.worker;
        meta.num_parts = static_cast<int32_t>(part_ids.size());
        v1::PushSparseResponse resp;
        if ((m == n && m <= per_part) || split) {
          meta.request_id = part_ids[0];
          const int64_t begin = split ? routes.begin[ps] : 0;
          PS_RETURN_IF_ERROR(
              transport_->PushSparse(ps, table, split ? part_keys.get() + begin : keys, m, dim,
                                     split ? part_rows.get() + begin * dim : grads, meta, &resp));
          if (resp.duplicate()) duplicate_pushes_.fetch_add(1);
          return absl::OkStatus();
        }
        // Each part is gathered from the caller's arrays by the transport, as it sends.
        for (int64_t begin = 0, part = 0; begin < m; begin += per_part, ++part) {
          const int64_t count = std::min(per_part, m - begin);
          meta.part = static_cast<int32_t>(part);
          meta.request_id = part_ids[part];
          // A part already applied is answered as a duplicate when the whole is retried.
          PS_RETURN_IF_ERROR(WithRetries(
              ps,
              [&] {
                resp.Clear();
                return transport_->PushSparseGather(ps, table, keys, routes.of(ps) + begin, count,
                                                    dim, grads, meta, &resp);
              },
              /*push=*/true, generation));
          if (resp.duplicate()) duplicate_pushes_.fetch_add(1);
        }
        return absl::OkStatus();
      },
      /*push=*/true, generation);
}

absl::StatusOr<v1::ListShardsResponse> ParameterClient::ListShards(int ps, bool include_backups) {
  v1::ListShardsRequest request;
  request.set_include_backups(include_backups);
  absl::StatusOr<v1::ListShardsResponse> out;
  PS_RETURN_IF_ERROR(WithRetries(ps, [&] {
    out = transport_->ListShards(ps, request);
    return out.status();
  }));
  return out;
}

absl::StatusOr<v1::InspectShardResponse> ParameterClient::InspectShard(
    int ps, const v1::InspectShardRequest& request) {
  absl::StatusOr<v1::InspectShardResponse> out;
  PS_RETURN_IF_ERROR(WithRetries(ps, [&] {
    out = transport_->InspectShard(ps, request);
    return out.status();
  }));
  return out;
}

absl::StatusOr<v1::TaskStatus> ParameterClient::GetStatus(int ps) {
  absl::StatusOr<v1::TaskStatus> out;
  PS_RETURN_IF_ERROR(WithRetries(ps, [&] {
    out = transport_->GetStatus(ps);
    return out.status();
  }));
  return out;
}

}  // namespace pscluster
