// A fault campaign through the real daemons: trials of single, double and triple SIGKILLs (the
// chief during a ps recovery, a ps during a chief restart, a worker and a ps together, both ps
// tasks, a ps or the chief in the middle of writing a checkpoint, the chief after the last
// step, after the final checkpoint and after training finished, ...), each killed task started
// again by a supervisor after a random delay, as Kubernetes would. Every trial trains the same
// model in sync mode and must end by itself with the model of the undisturbed run bit for bit
// (every value, optimizer slot and update count of the final checkpoint), every committed
// checkpoint verifying and no recovery record left behind. The undisturbed run must learn (an
// accuracy floor), and a trial whose script killed nothing fails: it tested nothing.
//
// FAULT_SEED picks the scripts and everything random in them: trial i of FAULT_TRIALS (default
// 3) runs script (FAULT_SEED * FAULT_TRIALS + i) mod the number of scripts, with seed
// FAULT_SEED + i for its steps, tasks and delays. CI passes the commit's number (git rev-list
// --count HEAD; printed, so a failure replays with the same FAULT_SEED): each commit takes the
// next three scripts, and five commits in a row cover all of them. tests/fault_campaign.sh runs
// as many trials as asked and prints the summary that docs/checkpoints.md quotes.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "storage/checkpoint.h"
#include "storage/crash_points.h"
#include "testing/model_snapshot.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

// The undisturbed softmax model's final test accuracy is about 0.8 (2 epochs of 12,000
// examples); a run that stops learning ends near 0.1.
constexpr double kAccuracyFloor = 0.7;
constexpr int kNumPs = 2;
constexpr int kNumWorkers = 2;
// RecoveryChiefFlags: checkpoints every 40 steps; 240 steps in all.
constexpr int64_t kCheckpointEvery = 40;
constexpr int64_t kFinalStep = 240;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::strtoll(v, nullptr, 10);
}

std::string TestDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::filesystem::remove_all(dir);
  return dir;
}

TestClusterOptions Options(const std::string& checkpoint_dir) {
  TestClusterOptions options;
  options.num_ps = kNumPs;
  options.num_workers = kNumWorkers;
  // The recovery tests' training (240 steps a worker, a checkpoint every 40).
  options.flags["chief"] = RecoveryChiefFlags(checkpoint_dir);
  // Steps slow enough that faults land inside training, not after it.
  options.flags["worker"] = {"--step_delay_ms=5"};
  return options;
}

// The chief's status, or nothing while it does not answer (it may be dead or restarting).
std::optional<v1::ClusterStatus> TryStatus(const std::string& address) {
  auto stub =
      v1::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::ClusterStatus status;
  if (!stub->GetClusterStatus(&ctx, v1::GetClusterStatusRequest(), &status).ok()) {
    return std::nullopt;
  }
  return status;
}

// Training's end: the final status, or DEADLINE_EXCEEDED for a stall.
absl::StatusOr<v1::ClusterStatus> AwaitFinished(const std::string& chief, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::optional<v1::ClusterStatus> s = TryStatus(chief);
    if (s && s->progress().finished()) return *s;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("training did not finish within ", absl::FormatDuration(timeout)));
}

// The end of a trial: training finished and the chief in the FINISHED phase, entered after
// `since` (the last time the supervisor started a task). A ps task restarted after training
// ended takes the chief through a recovery (RECOVERING, then FINISHED again), which the
// progress alone does not show: it stays finished throughout.
absl::StatusOr<v1::ClusterStatus> AwaitSettled(const std::string& chief, absl::Time since,
                                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::optional<v1::ClusterStatus> s = TryStatus(chief);
    if (s && s->progress().finished() && s->phase() == v1::FINISHED &&
        s->phase_since_unix_micros() > absl::ToUnixMicros(since)) {
      return *s;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "training did not finish, or the chief did not settle in the FINISHED phase after the "
      "last restart, within ",
      absl::FormatDuration(timeout)));
}

// The final model of a finished run: its newest committed checkpoint.
absl::StatusOr<ModelSnapshot> FinalModel(const std::string& dir) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> committed, ListCheckpoints(dir));
  if (committed.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  return ReadModelSnapshot(committed.front());
}

class Trial;

// A fault script: flags its victims start with (crash points), then what it does once the
// cluster trains.
struct Script {
  const char* name;
  std::function<void(Trial&, TestClusterOptions&)> arm;
  std::function<absl::Status(Trial&)> run;
};

// One trial: a cluster, a fault script, a supervisor.
class Trial {
 public:
  Trial(int index, uint64_t seed) : index_(index), rng_(seed) {}

  absl::Status Start(const Script& script) {
    dir_ = TestDir(absl::StrCat("trial-", index_));
    TestClusterOptions options = Options(dir_);
    if (script.arm) script.arm(*this, options);
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(options);
    if (!cluster.ok()) return cluster.status();
    cluster_ = *std::move(cluster);
    return absl::OkStatus();
  }

  // Waits until the global step reaches `step` (false on timeout or when training ended).
  bool AwaitStep(int64_t step, absl::Duration timeout = absl::Seconds(120)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      std::optional<v1::ClusterStatus> s = TryStatus(cluster_->chief_address());
      if (s && (s->global_step() >= step || s->progress().finished())) {
        return s->global_step() >= step;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  ChildProcess& Process(const std::string& task) {
    const std::string job = task.substr(0, task.find(':'));
    const int i = std::stoi(task.substr(task.find(':') + 1));
    return job == "chief" ? cluster_->chief() : job == "ps" ? cluster_->ps(i) : cluster_->worker(i);
  }

  // SIGKILLs `task` (if it is running) and waits until it is gone.
  void Kill(const std::string& task) {
    ChildProcess& p = Process(task);
    if (!p.Running()) return;
    p.Signal(SIGKILL).IgnoreError();
    p.WaitForExit(absl::Seconds(5)).IgnoreError();
    ++kills_;
    Log(absl::StrCat("killed ", task));
  }

  // Makes `task` start with a crash point of storage/crash_points.h armed, to die (SIGKILL) at
  // its n-th visit.
  void Arm(TestClusterOptions& options, const std::string& task, const std::string& point,
           int64_t nth) {
    options.flags[task] = {absl::StrCat("--crash_at=", point, "@", nth)};
    armed_ = task;
    Log(absl::StrCat(task, " armed to die at ", point, "@", nth));
  }
  const std::string& armed() const { return armed_; }

  // Waits until `task`, armed with a crash point, has died at it; then it starts without it.
  absl::Status AwaitCrash(const std::string& task) {
    ChildProcess& p = Process(task);
    absl::StatusOr<int> status = p.WaitForExit(absl::Seconds(180));
    if (!status.ok()) return absl::DeadlineExceededError(absl::StrCat(task, " never crashed"));
    if (!WIFSIGNALED(*status) || WTERMSIG(*status) != SIGKILL) {
      return absl::InternalError(
          absl::StrCat(task, " ended without its crash point: ", DescribeWaitStatus(*status)));
    }
    ++kills_;
    Log(absl::StrCat(task, " died at its crash point"));
    cluster_->SetFlags(task, {});
    return absl::OkStatus();
  }

  // The supervisor: starts `task` again after a random delay; a ps task half the time on a
  // new port (as a rescheduled pod comes back at a new IP), otherwise at its address.
  absl::Status Restart(const std::string& task) {
    absl::SleepFor(absl::Milliseconds(Uniform(100, 800)));
    const std::string job = task.substr(0, task.find(':'));
    const int i = std::stoi(task.substr(task.find(':') + 1));
    const bool same_address = job != "ps" || Uniform(0, 1) == 0;
    last_start_ = absl::Now();
    absl::Status s = cluster_->StartTask(job, i, same_address);
    Log(absl::StrCat("restarted ", task, same_address ? "" : " on a new port",
                     s.ok() ? "" : absl::StrCat(": ", s.message())));
    return s;
  }

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  std::string RandomPs() { return absl::StrCat("ps:", Uniform(0, kNumPs - 1)); }
  std::string RandomWorker() { return absl::StrCat("worker:", Uniform(0, kNumWorkers - 1)); }

  // Runs `script`; returns what it did. FAILED_PRECONDITION when it killed nothing.
  absl::StatusOr<std::string> RunFaults(const Script& script) {
    PS_RETURN_IF_ERROR(script.run(*this));
    if (kills_ == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the script \"", script.name, "\" killed nothing: the trial tests nothing"));
    }
    // A task the script killed but did not bring back (it never does) would be restarted here.
    for (const std::string& task :
         {std::string("chief:0"), std::string("ps:0"), std::string("ps:1"), std::string("worker:0"),
          std::string("worker:1")}) {
      if (!Process(task).Running()) PS_RETURN_IF_ERROR(Restart(task));
    }
    return script.name;
  }

  // Every committed checkpoint verifies; nothing else is left in the directory.
  absl::Status CheckCheckpoints() {
    PS_ASSIGN_OR_RETURN(std::vector<std::string> committed, ListCheckpoints(dir_));
    if (committed.empty()) return absl::DataLossError("no committed checkpoint");
    for (const std::string& path : committed) PS_RETURN_IF_ERROR(VerifyCheckpoint(path));
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      if (entry.path().filename() == "CHIEF_EPOCH") continue;  // the chiefs' fencing epoch
      if (!ReadManifest(entry.path().string()).ok()) {
        return absl::DataLossError(absl::StrCat(entry.path().string(), " is left behind"));
      }
    }
    return absl::OkStatus();
  }

  void Log(const std::string& what) {
    events_.push_back(what);
    LOG(INFO) << "trial " << index_ << ": " << what;
  }
  std::string Events() const { return absl::StrJoin(events_, "; "); }
  std::string Logs() { return cluster_ ? cluster_->Logs(40) : ""; }
  const std::string& dir() const { return dir_; }
  const std::string chief_address() const { return cluster_->chief_address(); }
  absl::Time last_start() const { return last_start_; }

 private:
  const int index_;
  std::mt19937_64 rng_;
  std::string dir_;
  std::unique_ptr<TestCluster> cluster_;
  std::vector<std::string> events_;
  std::string armed_;
  int kills_ = 0;
  absl::Time last_start_ = absl::InfinitePast();  // when the supervisor last started a task
};

// Waits for a random step of training, where a script kills.
absl::Status AtRandomStep(Trial& t) {
  const int64_t at = t.Uniform(20, 160);
  if (!t.AwaitStep(at)) return absl::DeadlineExceededError(absl::StrCat("never reached step ", at));
  t.Log(absl::StrCat("at step ", at));
  return absl::OkStatus();
}

std::vector<Script> AllScripts() {
  // Crash points of a checkpoint's write, armed for a checkpoint in the middle of training (the
  // n-th a process writes: the first before the first step, then every 40 steps).
  static const char* const kPsSavePoints[] = {kCrashSaveOpened, kCrashSaveMidway,
                                              kCrashSaveBeforeSync, kCrashSaveDone};
  static const char* const kManifestPoints[] = {
      kCrashManifestBeforeWrite, kCrashManifestBeforeRename, kCrashManifestBeforeDirSync};
  return {
      {"the chief during a ps recovery", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AtRandomStep(t));
         const std::string ps = t.RandomPs();
         t.Kill(ps);
         PS_RETURN_IF_ERROR(t.Restart(ps));
         absl::SleepFor(absl::Milliseconds(t.Uniform(0, 300)));
         t.Kill("chief:0");
         return t.Restart("chief:0");
       }},
      {"a ps during a chief restart", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AtRandomStep(t));
         t.Kill("chief:0");
         PS_RETURN_IF_ERROR(t.Restart("chief:0"));
         absl::SleepFor(absl::Milliseconds(t.Uniform(0, 300)));
         const std::string ps = t.RandomPs();
         t.Kill(ps);
         return t.Restart(ps);
       }},
      {"a worker and a ps together", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AtRandomStep(t));
         const std::string w = t.RandomWorker();
         const std::string ps = t.RandomPs();
         t.Kill(w);
         t.Kill(ps);
         PS_RETURN_IF_ERROR(t.Restart(ps));
         return t.Restart(w);
       }},
      {"both ps tasks", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AtRandomStep(t));
         t.Kill("ps:0");
         t.Kill("ps:1");
         PS_RETURN_IF_ERROR(t.Restart("ps:1"));
         return t.Restart("ps:0");
       }},
      {"a ps, then the chief, then the other ps", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AtRandomStep(t));
         t.Kill("ps:0");
         PS_RETURN_IF_ERROR(t.Restart("ps:0"));
         absl::SleepFor(absl::Milliseconds(t.Uniform(0, 200)));
         t.Kill("chief:0");
         PS_RETURN_IF_ERROR(t.Restart("chief:0"));
         absl::SleepFor(absl::Milliseconds(t.Uniform(0, 200)));
         t.Kill("ps:1");
         return t.Restart("ps:1");
       }},
      {"a ps in the middle of writing a checkpoint, sometimes with the chief",
       [](Trial& t, TestClusterOptions& o) {
         t.Arm(o, absl::StrCat("ps:", t.Uniform(0, kNumPs - 1)), kPsSavePoints[t.Uniform(0, 3)],
               t.Uniform(2, kFinalStep / kCheckpointEvery));
       },
       [](Trial& t) -> absl::Status {
         const std::string ps = t.armed();
         PS_RETURN_IF_ERROR(t.AwaitCrash(ps));
         if (t.Uniform(0, 1) == 0) {
           t.Kill("chief:0");
           // A ps task serves once the chief has taken it back: the chief comes first.
           PS_RETURN_IF_ERROR(t.Restart("chief:0"));
         }
         return t.Restart(ps);
       }},
      {"the chief in the middle of committing a checkpoint",
       [](Trial& t, TestClusterOptions& o) {
         t.Arm(o, "chief:0", kManifestPoints[t.Uniform(0, 2)],
               t.Uniform(2, kFinalStep / kCheckpointEvery));
       },
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(t.AwaitCrash("chief:0"));
         return t.Restart("chief:0");
       }},
      {"one ps", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AtRandomStep(t));
         const std::string ps = t.RandomPs();
         t.Kill(ps);
         return t.Restart(ps);
       }},
      {"one worker", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AtRandomStep(t));
         const std::string w = t.RandomWorker();
         t.Kill(w);
         return t.Restart(w);
       }},
      {"the chief", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AtRandomStep(t));
         t.Kill("chief:0");
         return t.Restart("chief:0");
       }},
      {"the chief after the last step, before the final checkpoint",
       [](Trial& t, TestClusterOptions& o) { t.Arm(o, "chief:0", kCrashTrainingEnded, 1); },
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(t.AwaitCrash("chief:0"));
         return t.Restart("chief:0");
       }},
      {"the chief after the final checkpoint, before the final evaluation",
       [](Trial& t, TestClusterOptions& o) { t.Arm(o, "chief:0", kCrashFinalCheckpointDone, 1); },
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(t.AwaitCrash("chief:0"));
         return t.Restart("chief:0");
       }},
      {"the chief after training finished", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AwaitFinished(t.chief_address(), absl::Seconds(240)).status());
         t.Kill("chief:0");
         return t.Restart("chief:0");
       }},
      {"a ps after training finished", nullptr,
       [](Trial& t) -> absl::Status {
         PS_RETURN_IF_ERROR(AwaitFinished(t.chief_address(), absl::Seconds(240)).status());
         const std::string ps = t.RandomPs();
         t.Kill(ps);
         return t.Restart(ps);
       }},
  };
}

struct Undisturbed {
  double accuracy = 0;
  ModelSnapshot model;
};

Undisturbed RunUndisturbed() {
  const std::string dir = TestDir("undisturbed");
  auto cluster = TestCluster::Start(Options(dir));
  CHECK(cluster.ok()) << cluster.status();
  absl::StatusOr<v1::ClusterStatus> end =
      AwaitFinished((*cluster)->chief_address(), absl::Seconds(240));
  CHECK(end.ok()) << "the undisturbed run: " << end.status() << "\n" << (*cluster)->Logs();
  absl::StatusOr<ModelSnapshot> model = FinalModel(dir);
  CHECK(model.ok()) << model.status();
  return {end->progress().test_accuracy(), *std::move(model)};
}

TEST(FaultCampaignTest, EveryTrialEndsWithTheUndisturbedModel) {
  const int64_t trials = EnvInt("FAULT_TRIALS", 3);
  const int64_t seed = EnvInt("FAULT_SEED", 1);
  const std::vector<Script> scripts = AllScripts();
  // Trial i runs script (seed * trials + i) mod n: every script once in n trials, and CI's seed
  // (the commit's number) moves on by one a commit, so consecutive commits take the next ones.
  auto script_of = [&](int64_t i) -> const Script& {
    return scripts[static_cast<size_t>((seed * trials + i) % static_cast<int64_t>(scripts.size()))];
  };
  std::printf("CAMPAIGN %lld trials, FAULT_SEED=%lld (replay: --test_env=FAULT_SEED=%lld)\n",
              static_cast<long long>(trials), static_cast<long long>(seed),
              static_cast<long long>(seed));
  const Undisturbed undisturbed = RunUndisturbed();
  ASSERT_EQ(undisturbed.model.step, kFinalStep);
  ASSERT_GE(undisturbed.accuracy, kAccuracyFloor) << "the undisturbed run did not learn";
  LOG(INFO) << "campaign: " << trials << " trials from seed " << seed
            << "; undisturbed final test accuracy " << undisturbed.accuracy;
  int wrong = 0, stalled = 0, bad_checkpoints = 0, not_run = 0;
  for (int64_t i = 0; i < trials; ++i) {
    const Script& script = script_of(i);
    Trial trial(static_cast<int>(i), static_cast<uint64_t>(seed + i));
    ASSERT_TRUE(trial.Start(script).ok());
    absl::StatusOr<std::string> faults = trial.RunFaults(script);
    std::string verdict;
    if (!faults.ok()) {
      ++not_run;
      verdict = absl::StrCat("FAULTS NOT INJECTED: ", faults.status().message());
    } else if (absl::StatusOr<v1::ClusterStatus> end =
                   AwaitSettled(trial.chief_address(), trial.last_start(), absl::Seconds(240));
               !end.ok()) {
      ++stalled;
      verdict = absl::StrCat("STALLED: ", end.status().message());
    } else if (absl::StatusOr<ModelSnapshot> model = FinalModel(trial.dir()); !model.ok()) {
      ++wrong;
      verdict = absl::StrCat("NO FINAL MODEL: ", model.status().message());
    } else if (absl::Status same = CompareModels(undisturbed.model, *model); !same.ok()) {
      ++wrong;
      verdict = absl::StrCat("WRONG MODEL: ", same.message());
    } else if (end->progress().test_accuracy() < kAccuracyFloor) {
      ++wrong;
      verdict = absl::StrCat("WRONG MODEL: final test accuracy ", end->progress().test_accuracy());
    } else if (absl::Status c = trial.CheckCheckpoints(); !c.ok()) {
      ++bad_checkpoints;
      verdict = absl::StrCat("BAD CHECKPOINTS: ", c.message());
    } else {
      verdict = absl::StrCat("ok, the undisturbed model bit for bit, final test accuracy ",
                             end->progress().test_accuracy());
    }
    // One line per trial, for the campaign script's summary.
    std::printf("CAMPAIGN trial %lld seed %lld: %s [%s] -> %s\n", static_cast<long long>(i),
                static_cast<long long>(seed + i), script.name, trial.Events().c_str(),
                verdict.c_str());
    std::fflush(stdout);
    EXPECT_EQ(verdict.rfind("ok", 0), 0u) << "trial " << i << ": " << verdict << "\n"
                                          << trial.Logs();
  }
  std::printf(
      "CAMPAIGN summary: %lld trials from seed %lld, undisturbed accuracy %.4f: "
      "%lld ok, %d wrong model, %d stalled, %d bad checkpoints, %d not injected\n",
      static_cast<long long>(trials), static_cast<long long>(seed), undisturbed.accuracy,
      static_cast<long long>(trials - wrong - stalled - bad_checkpoints - not_run), wrong, stalled,
      bad_checkpoints, not_run);
}

}  // namespace
}  // namespace pscluster
