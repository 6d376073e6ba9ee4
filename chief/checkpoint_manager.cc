#include "chief/checkpoint_manager.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/chief_epoch.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "storage/checkpoint.h"

namespace pscluster {

CheckpointManager::CheckpointManager(const CheckpointManagerOptions& options,
                                     ParameterClient* client)
    : options_(options), client_(client) {
  CHECK(!options_.dir.empty());
  CHECK(options_.clock != nullptr);
}

std::string CheckpointManager::last() const {
  absl::MutexLock lock(&mu_);
  return last_;
}

absl::StatusOr<std::vector<std::string>> CheckpointManager::Committed() const {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> checkpoints, ListCheckpoints(options_.dir));
  if (checkpoints.empty()) {
    return absl::NotFoundError(absl::StrCat("no committed checkpoint in ", options_.dir));
  }
  return checkpoints;
}

absl::StatusOr<v1::CheckpointResponse> CheckpointManager::Save(int64_t step,
                                                               const std::string& reason) {
  PS_ASSIGN_OR_RETURN(PendingCheckpoint pending, Cut(step, reason));
  return Commit(pending);
}

absl::StatusOr<CheckpointManager::PendingCheckpoint> CheckpointManager::Cut(
    int64_t step, const std::string& reason) {
  Clock* const clock = options_.clock;
  std::string path = absl::StrCat(options_.dir, "/", CheckpointDirName(step));
  PendingCheckpoint pending;
  pending.reason = reason;
  v1::CheckpointResponse& resp = pending.response;
  resp.set_step(step);
  // The newest committed checkpoint of this step, if any (a higher sequence is newer).
  std::string newest;
  int64_t newest_sequence = -1;
  {
    // An error here must not fall through to removing a committed checkpoint below.
    PS_ASSIGN_OR_RETURN(const std::vector<std::string> all, ListCheckpoints(options_.dir));
    const std::string base = CheckpointDirName(step);
    for (const std::string& p : all) {
      const std::string name = std::filesystem::path(p).filename().string();
      int64_t sequence = 0;
      if (name != base && !(absl::StartsWith(name, base + ".") &&
                            absl::SimpleAtoi(name.substr(base.size() + 1), &sequence))) {
        continue;
      }
      newest = p;
      newest_sequence = sequence;
      break;  // newest first
    }
  }
  if (newest_sequence >= 0) {
    absl::StatusOr<v1::CheckpointManifest> existing = ReadManifest(newest);
    if (existing.ok() && options_.sync.mode() == v1::SYNC &&
        existing->num_ps() == client_->num_ps()) {
      // At a step boundary the model is a function of the step: this one is saved already.
      // (Unless it was written by another number of ps tasks: a cluster restarted at another
      // size saves the same model in its own layout.)
      resp.set_path(newest);
      resp.set_bytes(existing->bytes());
      resp.set_micros(existing->write_micros());
      pending.committed = true;
      return pending;
    }
    // ASYNC and SSP apply updates without moving the global step: a save captures them in a
    // checkpoint of its own, newer than any of the step, never one written before (and never
    // into a committed one).
    path = absl::StrCat(options_.dir, "/", CheckpointDirName(step, newest_sequence + 1));
  }
  resp.set_path(path);
  std::error_code ec;
  std::filesystem::remove_all(path, ec);  // an earlier, uncommitted attempt
  pending.start = clock->Now();
  int64_t unused = 0;
  // A failed cut or write leaves its files: a ps task may still be writing them. The next
  // save of this path removes them (above), and each ps task finishes its write under way
  // before it cuts again.
  pending.chain = NextChain();
  const bool track = options_.full_every > 1;
  absl::Status cut = client_
                         ->SaveShards(path, step, &unused, v1::SAVE_CUT,
                                      pending.chain.empty() ? "" : pending.chain.back(), track)
                         .status();
  if (!cut.ok() && !pending.chain.empty() && cut.code() != absl::StatusCode::kCancelled &&
      !IsSupersededChief(cut)) {
    // A ps task cannot write a delta on the chain (it restarted, say): a full one instead,
    // once the tasks that did cut have written theirs, which then goes.
    LOG(WARNING) << "an incremental checkpoint on " << pending.chain.back() << " could not be cut ("
                 << cut << "): writing a full one";
    client_->SaveShards(path, step, &unused, v1::SAVE_AWAIT).status().IgnoreError();
    std::filesystem::remove_all(path, ec);
    pending.chain.clear();
    cut = client_->SaveShards(path, step, &unused, v1::SAVE_CUT, "", track).status();
  }
  if (!cut.ok()) {
    BreakChain();
    return cut;
  }
  return pending;
}

std::vector<std::string> CheckpointManager::NextChain() const {
  absl::MutexLock lock(&mu_);
  if (options_.full_every <= 1 || chain_.empty() ||
      static_cast<int>(chain_.size()) >= options_.full_every) {
    return {};
  }
  return chain_;
}

void CheckpointManager::BreakChain() {
  absl::MutexLock lock(&mu_);
  chain_.clear();
}

absl::Status CheckpointManager::Prepare() {
  int64_t unused = 0;
  return client_->SaveShards("", -1, &unused, v1::SAVE_PREPARE).status();
}

absl::StatusOr<v1::CheckpointResponse> CheckpointManager::Commit(const PendingCheckpoint& pending) {
  if (pending.committed) return pending.response;
  Clock* const clock = options_.clock;
  v1::CheckpointResponse resp = pending.response;
  const std::string& path = resp.path();
  const int64_t step = resp.step();
  std::error_code ec;
  int64_t bytes = 0;
  // Whatever happens below, the next checkpoint builds on this one only if it is committed.
  BreakChain();
  PS_ASSIGN_OR_RETURN(const std::vector<v1::SavedShard> saved,
                      client_->SaveShards(path, step, &bytes, v1::SAVE_AWAIT));
  // Commit only a whole model: every partition, and every table from every ps task. A ps task
  // that restarted since its shards were created has nothing to give.
  const int num_ps = client_->num_ps();
  int64_t dense = 0, tables = 0;
  for (const v1::SavedShard& shard : saved) (shard.is_table() ? tables : dense) += 1;
  // After a failover, the tasks that took a table part's virtual shards over write one each.
  const int64_t table_parts =
      static_cast<int64_t>(client_->model().tables_size()) * client_->TablePartsPerTable();
  if (dense != client_->placement().partitions_size() || tables != table_parts) {
    std::filesystem::remove_all(path, ec);
    return absl::FailedPreconditionError(
        absl::StrCat("the ps tasks gave ", dense, " of ", client_->placement().partitions_size(),
                     " dense partitions and ", tables, " of ", table_parts,
                     " table parts (did a ps task restart?); not committed"));
  }
  v1::CheckpointManifest manifest;
  manifest.set_step(step);
  manifest.set_created_unix_micros(absl::ToUnixMicros(clock->Now()));
  manifest.set_num_ps(num_ps);
  *manifest.mutable_model() = client_->model();
  *manifest.mutable_placement() = client_->placement();
  *manifest.mutable_config() = options_.config;
  *manifest.mutable_sync() = options_.sync;
  *manifest.mutable_cluster() = options_.cluster;
  manifest.mutable_shards()->Add(saved.begin(), saved.end());
  manifest.mutable_chain()->Add(pending.chain.begin(), pending.chain.end());
  manifest.set_bytes(bytes);
  manifest.set_write_micros(absl::ToInt64Microseconds(clock->Now() - pending.start));
  // A chief that was replaced while it saved must not commit: its successor may be writing
  // the same directory. Checked just before the rename that commits.
  PS_RETURN_IF_ERROR(
      CommitManifest(path, manifest, options_.crash_points, [this] { return CheckStillChief(); }));
  resp.set_bytes(bytes);
  resp.set_micros(manifest.write_micros());
  LOG(INFO) << absl::StrFormat(
      "checkpoint of step %d committed (%s): %.2f MiB in %.1f ms at %s%s", step, pending.reason,
      bytes / 1048576.0, resp.micros() / 1000.0, path,
      pending.chain.empty() ? ""
                            : absl::StrCat(" (incremental, on ", pending.chain.back(), ", ",
                                           pending.chain.size() + 1, " in its chain)"));
  absl::Status pruned = PruneCheckpoints(options_.dir, options_.keep);
  if (!pruned.ok()) LOG(WARNING) << "cannot delete old checkpoints: " << pruned;
  absl::MutexLock lock(&mu_);
  last_ = path;
  if (options_.full_every > 1) {
    chain_ = pending.chain;
    chain_.push_back(std::filesystem::path(path).filename().string());
  }
  return resp;
}

absl::StatusOr<int64_t> CheckpointManager::RestoreEveryPs(const std::vector<std::string>& why,
                                                          int64_t step_before,
                                                          int64_t accumulator_step) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> checkpoints, Committed());
  // First the record, then the changes: a chief that dies from here on leaves the record, and
  // its successor restores every ps task again (RestoreEveryPs is idempotent).
  v1::RecoveryIntent intent;
  intent.set_step_before(step_before);
  for (const std::string& w : why) intent.add_restarted(w);
  intent.set_started_unix_micros(absl::ToUnixMicros(options_.clock->Now()));
  intent.set_checkpoint_path(checkpoints.front());
  if (absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(checkpoints.front()); m.ok()) {
    intent.set_checkpoint_step(m->step());
  }
  PS_RETURN_IF_ERROR(RecordRecovery(intent));
  MaybeCrash(options_.crash_points, kCrashRecoveryIntentWritten);
  // Tasks that lost their shards get them again, held: no worker sees initial values.
  CreateShardsOptions create;
  create.start_step = std::max<int64_t>(step_before, 0);
  create.hold_until_restored = true;
  if (absl::Status s = client_->CreateAll(options_.sync, nullptr, create); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot re-create the shards: ", s.message()));
  }
  MaybeCrash(options_.crash_points, kCrashRecoveryCreated);
  absl::StatusOr<int64_t> restored = RestoreLatest(accumulator_step, &intent);
  if (restored.ok()) MaybeCrash(options_.crash_points, kCrashRecoveryRestored);
  if (restored.status().code() == absl::StatusCode::kDataLoss) {
    // No checkpoint restores: let the held shards serve what they have.
    create.hold_until_restored = false;
    absl::Status released = client_->CreateAll(options_.sync, nullptr, create);
    if (!released.ok()) LOG(ERROR) << "cannot release the held shards: " << released;
  }
  return restored;
}

absl::Status CheckpointManager::CheckStillChief() const {
  if (options_.chief_epoch == 0) return absl::OkStatus();
  PS_ASSIGN_OR_RETURN(const int64_t recorded, ReadChiefEpoch(options_.dir));
  if (recorded > options_.chief_epoch) {
    return SupersededChiefError(absl::StrCat("writing ", options_.dir), options_.chief_epoch,
                                recorded);
  }
  return absl::OkStatus();
}

absl::Status CheckpointManager::RecordRecovery(const v1::RecoveryIntent& intent) {
  PS_RETURN_IF_ERROR(CheckStillChief());
  if (absl::Status s = WriteRecoveryIntent(options_.dir, intent); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot record the recovery before starting it: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckpointManager::FinishRecovery() {
  // Once a newer chief has started, the record is its own.
  PS_RETURN_IF_ERROR(CheckStillChief());
  if (absl::Status s = ClearRecoveryIntent(options_.dir); !s.ok()) {
    // Harmless but wasteful: the next chief would restore again.
    LOG(ERROR) << "cannot clear the recovery record: " << s;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RecoveryIntent> CheckpointManager::UnfinishedRecovery() const {
  return ReadRecoveryIntent(options_.dir);
}

absl::StatusOr<int64_t> CheckpointManager::RestoreLatest(int64_t accumulator_step,
                                                         v1::RecoveryIntent* intent) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> checkpoints, Committed());
  // The ps tasks' tables no longer hold the changes since the last cut.
  BreakChain();
  // With the midway crash point armed, ps:0 is restored alone first, then the crash.
  const bool one_first = options_.crash_points != nullptr &&
                         options_.crash_points->point() == kCrashRecoveryRestoreMidway;
  absl::Status last_error;
  for (const std::string& path : checkpoints) {
    // An incremental checkpoint comes with those it builds on.
    absl::StatusOr<std::vector<ChainLink>> links = ReadChain(path);
    if (!links.ok()) {
      last_error = links.status();
      LOG(ERROR) << "checkpoint " << path << " is unreadable: " << links.status()
                 << "; falling back to the previous one";
      continue;
    }
    const v1::CheckpointManifest* const manifest = &links->back().manifest;
    std::vector<v1::CheckpointLink> chain;
    for (size_t i = 0; i + 1 < links->size(); ++i) {
      v1::CheckpointLink& link = chain.emplace_back();
      link.set_checkpoint_path((*links)[i].path);
      link.set_checkpoint(std::filesystem::path((*links)[i].path).filename().string());
      *link.mutable_saved() = (*links)[i].manifest.shards();
    }
    if (intent != nullptr && intent->checkpoint_path() != path) {
      intent->set_checkpoint_path(path);
      intent->set_checkpoint_step(manifest->step());
      PS_RETURN_IF_ERROR(RecordRecovery(*intent));
    }
    const std::vector<v1::SavedShard> saved(manifest->shards().begin(), manifest->shards().end());
    const int64_t acc_step = accumulator_step >= 0 ? accumulator_step : manifest->step();
    const absl::Time start = options_.clock->Now();
    absl::Status s;
    if (one_first) {
      const std::vector<int> first = {0};
      std::vector<int> rest;
      for (int ps = 1; ps < client_->num_ps(); ++ps) rest.push_back(ps);
      s = client_->RestoreShards(path, saved, acc_step, &first, chain);
      if (s.ok()) MaybeCrash(options_.crash_points, kCrashRecoveryRestoreMidway);
      if (s.ok() && !rest.empty()) s = client_->RestoreShards(path, saved, acc_step, &rest, chain);
    } else {
      s = client_->RestoreShards(path, saved, acc_step, nullptr, chain);
    }
    if (s.ok()) {
      LOG(INFO) << "restored checkpoint " << path << " (step " << manifest->step()
                << ", written by " << manifest->num_ps() << " ps tasks, restored into "
                << client_->num_ps() << ")"
                << (chain.empty() ? ""
                                  : absl::StrCat(", incremental: on ", chain.size(),
                                                 " checkpoints from ", chain.front().checkpoint()))
                << " in " << absl::FormatDuration(options_.clock->Now() - start);
      return manifest->step();
    }
    if (s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled ||
        IsSupersededChief(s)) {
      // A ps task is unreachable, the chief is stopping, or it has been replaced: not the
      // checkpoint's fault.
      return s;
    }
    last_error = s;
    LOG(ERROR) << "checkpoint " << path << " cannot be restored: " << s
               << "; falling back to the previous one";
  }
  return absl::DataLossError(
      absl::StrCat("no checkpoint in ", options_.dir, " restores: ", last_error.message()));
}

}  // namespace pscluster
