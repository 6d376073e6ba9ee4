#include "chief/recovery_driver.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace pscluster {

RecoveryDriver::Result RecoveryDriver::AfterRestart(const std::vector<std::string>& restarted,
                                                    int64_t step_before, bool rewind) {
  Result result;
  absl::StatusOr<int64_t> restored =
      checkpoints_ == nullptr
          ? absl::NotFoundError("no --checkpoint_dir")
          : checkpoints_->RestoreEveryPs(restarted, step_before, rewind ? -1 : step_before);
  result.error = restored.status();
  if (restored.ok() && rewind) {
    result.summary = absl::StrCat("restored every ps task to the checkpoint of step ", *restored,
                                  "; the global step goes back from ", step_before, " to ",
                                  *restored, ": steps ", *restored, "..", step_before - 1,
                                  " are computed again from the same batches (",
                                  step_before - *restored, " steps of work lost)");
  } else if (restored.ok()) {
    result.summary =
        absl::StrCat("restored every ps task to the checkpoint of step ", *restored,
                     "; progress lost: the updates of steps ", *restored, "..", step_before);
  } else if (restored.status().code() == absl::StatusCode::kNotFound ||
             restored.status().code() == absl::StatusCode::kDataLoss) {
    // Nothing to restore: the lost shards start again from their initial values. (After
    // DATA_LOSS, RestoreEveryPs has created them already and released its hold.)
    const bool none = restored.status().code() == absl::StatusCode::kNotFound;
    if (none) {
      CreateShardsOptions create;
      create.start_step = step_before;
      if (absl::Status created = client_->CreateAll(sync_, nullptr, create); !created.ok()) {
        result.error = created;
        result.summary = absl::StrCat("cannot re-create the shards: ", created.message());
        return result;
      }
    }
    result.error = absl::OkStatus();
    result.summary = none ? "no checkpoint to restore: the restarted shards start from their "
                            "initial values"
                          : absl::StrCat("restore failed: ", restored.status().message(),
                                         "; the restarted shards start from their initial values");
    if (rewind) absl::StrAppend(&result.summary, "; step ", step_before, " starts over");
  } else {
    result.summary =
        absl::StrCat("not finished (tried again shortly): ", restored.status().message());
    return result;
  }
  result.done = true;
  result.restored_step = restored.ok() ? *restored : -1;
  return result;
}

std::vector<std::string> RecoveryDriver::ReasonsToRestoreAtStart(
    int64_t fresh, const std::vector<int>& awaiting) const {
  // The cluster's state cannot be trusted if a recovery was under way when the last chief
  // stopped (its record is there) or a ps task still waits for a restore.
  std::vector<std::string> why;
  if (checkpoints_ != nullptr) {
    absl::StatusOr<v1::RecoveryIntent> unfinished = checkpoints_->UnfinishedRecovery();
    if (unfinished.ok()) {
      LOG(WARNING) << "the previous chief was recovering ("
                   << absl::StrJoin(unfinished->restarted(), ", ") << " restarted; restoring "
                   << unfinished->checkpoint_path() << ") when it stopped: redoing the recovery";
      why.assign(unfinished->restarted().begin(), unfinished->restarted().end());
    } else if (unfinished.status().code() != absl::StatusCode::kNotFound) {
      LOG(ERROR) << unfinished.status() << ": treating it as a recovery under way";
      why.push_back("an unreadable recovery record");
    }
  }
  for (int ps : awaiting) why.push_back(absl::StrCat("ps:", ps, " waiting for a restore"));
  if ((fresh == 0 && why.empty()) || checkpoints_ == nullptr || !checkpoints_->HasCheckpoint()) {
    return {};
  }
  // New variables, or a state half recovered: every ps task goes to the newest checkpoint.
  if (why.empty()) why.push_back("new variables");
  return why;
}

absl::StatusOr<int64_t> RecoveryDriver::RestoreAtStart(const std::vector<std::string>& why) {
  absl::StatusOr<int64_t> restored = checkpoints_->RestoreEveryPs(why, -1, -1);
  if (restored.ok()) return restored;
  if (restored.status().code() == absl::StatusCode::kDataLoss) {
    LOG(ERROR) << restored.status() << "; starting from the values the ps tasks hold";
    return -1;
  }
  return absl::Status(restored.status().code(),
                      absl::StrCat("cannot restore the checkpoint: ", restored.status().message()));
}

absl::Status RecoveryDriver::Finish() {
  return checkpoints_ == nullptr ? absl::OkStatus() : checkpoints_->FinishRecovery();
}

}  // namespace pscluster
