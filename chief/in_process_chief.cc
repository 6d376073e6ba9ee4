#include "chief/in_process_chief.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "model/model.h"

namespace pscluster {
namespace {

// The cluster of TF_CONFIG's form: chief:0 and `num_ps` ps and `num_workers` worker tasks on
// 127.0.0.1 (never dialled: the chief reaches the stores in this process).
absl::StatusOr<v1::ClusterConfig> LocalCluster(int num_ps, int num_workers) {
  const auto hosts = [](int n) {
    std::vector<std::string> h(n, "\"127.0.0.1:0\"");
    return absl::StrJoin(h, ", ");
  };
  return ParseTfConfig(absl::StrCat(R"({"cluster": {"chief": ["127.0.0.1:0"], "ps": [)",
                                    hosts(num_ps), R"(], "worker": [)", hosts(num_workers),
                                    R"(]}, "task": {"type": "chief", "index": 0}})"));
}

absl::Status Register(Coordinator* chief, absl::string_view job, int index, int port) {
  v1::RegisterTaskRequest req;
  *req.mutable_task() = MakeTaskId(job, index);
  req.set_address(absl::StrCat("127.0.0.1:", port));
  req.set_incarnation(1);
  v1::RegisterTaskResponse resp;
  return chief->RegisterTask(req, &resp);
}

}  // namespace

InProcessChief::InProcessChief() : clock_(absl::Now(), FakeClock::Waits::kBlock) {}

absl::StatusOr<std::unique_ptr<InProcessChief>> InProcessChief::Start(const Options& options) {
  std::unique_ptr<InProcessChief> chief(new InProcessChief());
  chief->stores_ = std::make_unique<InProcessPsTransport>(options.num_ps, options.store);
  CoordinatorOptions o;
  PS_ASSIGN_OR_RETURN(o.cluster, LocalCluster(options.num_ps, options.num_workers));
  o.config = options.config;
  PS_ASSIGN_OR_RETURN(o.model, ModelSpecFromConfig(options.config));
  o.training = options.training;
  o.sync = options.sync;
  o.placement = options.placement;
  o.checkpoint_dir = options.checkpoint_dir;
  o.crash_points = options.crash_points;
  o.clock = options.clock != nullptr ? options.clock : &chief->clock_;
  // Nothing in this process sends heartbeats.
  o.heartbeat_timeout = absl::InfiniteDuration();
  InProcessPsTransport* stores = chief->stores_.get();
  o.make_ps_transport =
      [stores](const std::vector<std::string>&) -> absl::StatusOr<std::unique_ptr<PsTransport>> {
    return stores->Share();
  };
  PS_ASSIGN_OR_RETURN(chief->coordinator_, Coordinator::Create(o));
  Coordinator* coordinator = chief->coordinator_.get();
  coordinator->Start();
  for (int i = 0; i < options.num_ps; ++i) {
    PS_RETURN_IF_ERROR(Register(coordinator, kPsJob, i, 5000 + i));
  }
  for (int i = 0; i < options.num_workers; ++i) {
    PS_RETURN_IF_ERROR(Register(coordinator, kWorkerJob, i, 6000 + i));
    chief->clients_.push_back(std::make_unique<InProcessChiefClient>(coordinator, o.clock));
  }
  // The chief creates the variables on its own thread; GetModel answers once they are.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (true) {
    absl::Status ready =
        coordinator->GetModel(v1::GetModelRequest(), CallContext(), &chief->model_);
    if (ready.ok()) break;
    if (coordinator->phase() == v1::FAILED || absl::Now() > deadline) {
      v1::ClusterStatus status;
      coordinator->GetClusterStatus(&status);
      return absl::Status(ready.code(),
                          absl::StrCat("the in-process chief is not ready (", ready.message(),
                                       "): ", status.ShortDebugString()));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  return chief;
}

InProcessChief::~InProcessChief() {
  if (coordinator_ == nullptr) return;
  // Every timed wait of the chief's threads ends from here on, so that it can stop.
  clock_.set_waits(FakeClock::Waits::kJump);
  coordinator_->Stop();
  coordinator_->Join();
}

ChiefClient* InProcessChief::client(int worker) { return clients_.at(worker).get(); }

}  // namespace pscluster
