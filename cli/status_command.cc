#include "cli/status_command.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/command_output.h"
#include "cli/live_cluster.h"
#include "cli/table.h"
#include "client/grpc_channel.h"
#include "common/cluster_spec.h"
#include "common/grpc_status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/ps_service.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"

namespace pscluster {
namespace {

std::string HealthName(v1::TaskHealth h) {
  switch (h) {
    case v1::HEALTH_SERVING:
      return "SERVING";
    case v1::HEALTH_MISSING:
      return "MISSING";
    case v1::HEALTH_STOPPED:
      return "STOPPED";
    default:
      return "UNKNOWN";
  }
}

std::string Uptime(int64_t micros) {
  if (micros <= 0) return "-";
  return absl::FormatDuration(absl::Seconds(absl::ToInt64Seconds(absl::Microseconds(micros))));
}

std::string ModeName(const v1::SyncOptions& sync) {
  const std::string local = sync.local_steps() > 1 ? absl::StrCat(", ", sync.local_steps(),
                                                                  " local steps per worker push")
                                                   : "";
  switch (sync.mode()) {
    case v1::SYNC:
      return sync.replicas_to_aggregate() > 0
                 ? absl::StrCat("sync (", sync.replicas_to_aggregate(), " replicas per step)")
                 : "sync (every worker each step)";
    case v1::SSP:
      return absl::StrCat("ssp (staleness ", sync.staleness(), local, ")");
    default:
      return sync.local_steps() > 1 ? absl::StrCat("async (", local.substr(2), ")") : "async";
  }
}

// One reading of a task's counters.
struct Sample {
  absl::Status status;  // OK when the task answered
  absl::Time at;
  int64_t pushes = 0;
  int64_t pulls = 0;
};

bool ShouldProbe(const v1::TaskStatus& t) {
  if (t.address().empty()) return false;
  if (t.task().job() != kPsJob && t.task().job() != kWorkerJob) return false;
  return t.health() == v1::HEALTH_SERVING || t.health() == v1::HEALTH_MISSING;
}

Sample Probe(const v1::TaskStatus& t, absl::Duration timeout, const TlsConfig& tls) {
  GrpcChannelOptions options;
  options.tls = tls;
  auto channel = NewGrpcChannel(t.address(), options);
  grpc::ClientContext ctx;
  // A task the chief sees serving whose first connection attempt fails is tried again (gRPC
  // reconnects within about a second) for up to 3 s: only one that stays unreachable is
  // reported so. A MISSING task (no heartbeat) is likely gone: one attempt.
  const bool retry_connect = t.health() == v1::HEALTH_SERVING;
  ctx.set_wait_for_ready(retry_connect);
  ctx.set_deadline(
      std::chrono::system_clock::now() +
      absl::ToChronoMilliseconds(retry_connect ? std::min(timeout, absl::Seconds(3)) : timeout));
  Sample sample;
  grpc::Status s;
  if (t.task().job() == kPsJob) {
    v1::ListShardsResponse shards;
    s = v1::ParameterServer::NewStub(channel)->ListShards(&ctx, v1::ListShardsRequest(), &shards);
    for (const v1::ShardStats& shard : shards.shards()) {
      sample.pushes += shard.pushes();
      sample.pulls += shard.pulls();
    }
  } else {
    v1::TaskStatus worker;
    s = v1::Worker::NewStub(channel)->GetStatus(&ctx, v1::GetStatusRequest(), &worker);
    sample.pushes = sample.pulls = worker.step();
  }
  sample.at = absl::Now();
  if (!s.ok()) {
    sample.status = absl::UnavailableError(absl::StrCat("cannot reach ", TaskName(t.task()), " at ",
                                                        t.address(), ": ", s.error_message()));
  }
  return sample;
}

// Probes every task that should answer, in parallel; keyed by task name.
std::map<std::string, Sample> ProbeAll(const v1::ClusterStatus& status, absl::Duration timeout,
                                       const TlsConfig& tls) {
  std::map<std::string, std::future<Sample>> pending;
  for (const v1::TaskStatus& t : status.tasks()) {
    if (!ShouldProbe(t)) continue;
    pending.emplace(TaskName(t.task()), std::async(std::launch::async, Probe, t, timeout, tls));
  }
  std::map<std::string, Sample> out;
  for (auto& [name, f] : pending) out.emplace(name, f.get());
  return out;
}

}  // namespace

std::string FormatClusterStatus(const v1::ClusterStatus& status,
                                const std::set<std::string>& measured) {
  TextTable table({"TASK", "ADDRESS", "HEALTH", "UPTIME", "STEP", "PUSH/S", "PULL/S", "DETAIL"});
  for (const v1::TaskStatus& t : status.tasks()) {
    const bool has_rates = measured.count(TaskName(t.task())) > 0;
    table.AddRow({TaskName(t.task()), t.address(), HealthName(t.health()),
                  Uptime(t.uptime_micros()), absl::StrCat(t.step()),
                  has_rates ? absl::StrFormat("%.1f", t.pushes_per_second()) : "-",
                  has_rates ? absl::StrFormat("%.1f", t.pulls_per_second()) : "-", t.detail()});
  }
  std::string out = absl::StrCat(table.ToString(), "\nglobal step: ", status.global_step(),
                                 ", mode: ", ModeName(status.sync()), "\n");
  if (status.waiting_for_size() > 0) {
    std::vector<std::string> names;
    for (const v1::TaskId& t : status.waiting_for()) names.push_back(TaskName(t));
    absl::StrAppend(&out, "waiting for: ", absl::StrJoin(names, ", "), "\n");
  }
  if (!status.last_checkpoint().empty()) {
    absl::StrAppend(&out, "last checkpoint: ", status.last_checkpoint(), "\n");
  }
  absl::StrAppend(&out, "state: ", status.state(), "\n");
  if (status.phase() != v1::CHIEF_PHASE_UNKNOWN) {
    std::string phase = absl::AsciiStrToLower(v1::ChiefPhase_Name(status.phase()));
    absl::StrAppend(&out, "chief phase: ", phase);
    if (!status.phase_detail().empty()) absl::StrAppend(&out, " (", status.phase_detail(), ")");
    if (status.phase_since_unix_micros() > 0) {
      const absl::Duration since =
          absl::Now() - absl::FromUnixMicros(status.phase_since_unix_micros());
      absl::StrAppend(&out, ", for ", absl::FormatDuration(absl::Trunc(since, absl::Seconds(1))));
    }
    absl::StrAppend(&out, "\n");
  }
  // Replication 2: backups rebuilt onto failed-over tasks that came back.
  for (const v1::BackupRebuild& r : status.rebuilds()) {
    absl::StrAppend(&out, "backups rebuilt onto ps:", r.ps_task(), ": ");
    const absl::Duration elapsed = absl::Microseconds(r.elapsed_micros());  // the chief's clock
    const std::string rows =
        r.rows_copied() > 0 ? absl::StrCat(r.rows_copied(), " table rows, ") : std::string();
    switch (r.state()) {
      case v1::BACKUP_REBUILD_DONE:
        absl::StrAppend(&out, "done, ", r.primaries_done(), " of ", r.primaries(), " primaries, ",
                        r.shards_copied(), " dense shards, ", rows, HumanBytes(r.bytes_copied()),
                        " copied in ", absl::FormatDuration(elapsed));
        break;
      case v1::BACKUP_REBUILD_DROPPING:
        absl::StrAppend(&out, "lost again, its primaries told to stop forwarding to it");
        break;
      default:
        absl::StrAppend(&out, "copying, ", r.primaries_done(), " of ", r.primaries(),
                        " primaries, ", r.shards_copied(), " dense shards, ", rows,
                        HumanBytes(r.bytes_copied()), " copied, for ",
                        absl::FormatDuration(absl::Trunc(elapsed, absl::Seconds(1))));
        if (r.tries() > 1) absl::StrAppend(&out, ", try ", r.tries());
        if (!r.last_error().empty()) absl::StrAppend(&out, " (last error: ", r.last_error(), ")");
        break;
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

CommandOutput RunStatusCommand(ChiefClient& chief, const StatusOptions& options) {
  CommandOutput out;
  v1::ClusterStatus status;
  out.status = chief.GetClusterStatus(&status);
  if (!out.status.ok()) return out;

  std::map<std::string, Sample> first = ProbeAll(status, options.rpc_timeout, options.tls);
  std::map<std::string, Sample> second;
  if (options.rate_window > absl::ZeroDuration()) {
    absl::SleepFor(options.rate_window);
    // The later picture is the one shown; if the chief stopped answering meanwhile, the first.
    v1::ClusterStatus later;
    if (chief.GetClusterStatus(&later).ok()) status = later;
    second = ProbeAll(status, options.rpc_timeout, options.tls);
  }

  std::vector<absl::Status> errors;
  std::set<std::string> measured;
  for (v1::TaskStatus& t : *status.mutable_tasks()) {
    const std::string name = TaskName(t.task());
    auto a = first.find(name);
    auto b = second.find(name);
    const Sample* last = b != second.end() ? &b->second : a != first.end() ? &a->second : nullptr;
    if (last == nullptr) continue;
    if (!last->status.ok()) {
      errors.push_back(last->status);
      t.set_detail(t.detail().empty() ? "unreachable" : absl::StrCat(t.detail(), "; unreachable"));
      continue;
    }
    if (a == first.end() || b == second.end() || !a->second.status.ok()) continue;
    const double seconds = absl::ToDoubleSeconds(b->second.at - a->second.at);
    if (seconds <= 0) continue;
    t.set_pushes_per_second((b->second.pushes - a->second.pushes) / seconds);
    t.set_pulls_per_second((b->second.pulls - a->second.pulls) / seconds);
    measured.insert(name);
  }
  out.status = MergeErrors(errors);
  out.text = options.format == OutputFormat::kJson ? ReportToJson(status)
                                                   : FormatClusterStatus(status, measured);
  return out;
}

}  // namespace pscluster
