#include "common/cluster_spec.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace pscluster {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

constexpr absl::string_view kKnownJobs[] = {kChiefJob, kPsJob, kWorkerJob, kEvaluatorJob};

bool IsKnownJob(absl::string_view job) {
  return std::find(std::begin(kKnownJobs), std::end(kKnownJobs), job) != std::end(kKnownJobs);
}

std::string KnownJobsList() { return absl::StrJoin(kKnownJobs, ", "); }

// A JSON number or numeric string that is a non-negative integer.
absl::StatusOr<int> JsonIndex(const Value& v, absl::string_view what) {
  double d = 0;
  if (v.kind_case() == Value::kNumberValue) {
    d = v.number_value();
  } else if (v.kind_case() == Value::kStringValue) {
    if (!absl::SimpleAtod(v.string_value(), &d)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " must be an integer, got \"", v.string_value(), "\""));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be an integer"));
  }
  if (d != std::floor(d) || d < 0 || d > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a non-negative integer, got ", d));
  }
  return static_cast<int>(d);
}

absl::StatusOr<v1::JobDef> ParseJob(const std::string& name, const Value& v) {
  v1::JobDef job;
  job.set_name(name);
  auto& tasks = *job.mutable_tasks();
  if (v.kind_case() == Value::kListValue) {
    const ListValue& list = v.list_value();
    for (int i = 0; i < list.values_size(); ++i) {
      if (list.values(i).kind_case() != Value::kStringValue) {
        return absl::InvalidArgumentError(
            absl::StrCat("address ", i, " of job \"", name, "\" must be a \"host:port\" string"));
      }
      tasks[i] = list.values(i).string_value();
    }
  } else if (v.kind_case() == Value::kStructValue) {
    // TensorFlow's sparse form: {"0": "h:p", "3": "h:p"}.
    for (const auto& [key, addr] : v.struct_value().fields()) {
      Value index_value;
      index_value.set_string_value(key);
      PS_ASSIGN_OR_RETURN(int index,
                          JsonIndex(index_value, absl::StrCat("task index of job \"", name, "\"")));
      if (addr.kind_case() != Value::kStringValue) {
        return absl::InvalidArgumentError(
            absl::StrCat("address of ", name, ":", index, " must be a \"host:port\" string"));
      }
      tasks[index] = addr.string_value();
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("job \"", name,
                     "\" must be a list of \"host:port\" strings or an object of index -> "
                     "address"));
  }
  return job;
}

void SortJobs(v1::ClusterSpec* spec) {
  std::sort(spec->mutable_jobs()->begin(), spec->mutable_jobs()->end(),
            [](const v1::JobDef& a, const v1::JobDef& b) { return a.name() < b.name(); });
}

absl::StatusOr<v1::ClusterSpec> ParseHostFlags(const ClusterConfigSources& s) {
  v1::ClusterSpec spec;
  const std::pair<absl::string_view, const std::string*> flags[] = {
      {kChiefJob, &s.chief_hosts},
      {kPsJob, &s.ps_hosts},
      {kWorkerJob, &s.worker_hosts},
      {kEvaluatorJob, &s.evaluator_hosts}};
  for (const auto& [job_name, hosts] : flags) {
    if (hosts->empty()) continue;
    v1::JobDef* job = spec.add_jobs();
    job->set_name(std::string(job_name));
    int index = 0;
    for (absl::string_view host : absl::StrSplit(*hosts, ',')) {
      (*job->mutable_tasks())[index++] = std::string(absl::StripAsciiWhitespace(host));
    }
  }
  SortJobs(&spec);
  return spec;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read cluster spec file \"", path, "\""));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  auto malformed = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed address \"", address, "\": ", why, " (expected host:port)"));
  };
  HostPort hp;
  absl::string_view port;
  if (absl::StartsWith(address, "[")) {
    size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return malformed("unterminated IPv6 host or missing port");
    }
    hp.host = std::string(address.substr(1, close - 1));
    port = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return malformed("no port");
    hp.host = std::string(address.substr(0, colon));
    port = address.substr(colon + 1);
    if (hp.host.find(':') != std::string::npos) {
      return malformed("IPv6 hosts must be in brackets");
    }
  }
  if (hp.host.empty()) return malformed("empty host");
  for (char c : hp.host) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_' && c != ':') {
      return malformed(absl::StrCat("invalid character '", std::string(1, c), "' in host"));
    }
  }
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      port.size() > 5 || !absl::SimpleAtoi(port, &hp.port) || hp.port > 65535) {
    return malformed(absl::StrCat("port \"", port, "\" is not a number in 0..65535"));
  }
  return hp;
}

int NumTasks(const v1::ClusterSpec& spec, absl::string_view job) {
  for (const v1::JobDef& j : spec.jobs()) {
    if (j.name() == job) return j.tasks_size();
  }
  return 0;
}

absl::StatusOr<std::string> TaskAddress(const v1::ClusterSpec& spec, absl::string_view job,
                                        int index) {
  for (const v1::JobDef& j : spec.jobs()) {
    if (j.name() != job) continue;
    auto it = j.tasks().find(index);
    if (it != j.tasks().end()) return it->second;
  }
  return absl::NotFoundError(absl::StrCat("no task ", job, ":", index, " in the cluster"));
}

std::string TaskName(const v1::TaskId& task) { return absl::StrCat(task.job(), ":", task.index()); }

v1::TaskId MakeTaskId(absl::string_view job, int index) {
  v1::TaskId t;
  t.set_job(std::string(job));
  t.set_index(index);
  return t;
}

absl::Status ValidateClusterConfig(const v1::ClusterConfig& config) {
  const v1::ClusterSpec& spec = config.cluster();
  absl::flat_hash_map<std::string, std::string> used;  // address -> task
  absl::flat_hash_map<std::string, int> seen_jobs;
  for (const v1::JobDef& job : spec.jobs()) {
    if (!IsKnownJob(job.name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown job \"", job.name(), "\" in cluster; expected one of ", KnownJobsList()));
    }
    if (!seen_jobs.emplace(job.name(), 1).second) {
      return absl::InvalidArgumentError(absl::StrCat("job \"", job.name(), "\" listed twice"));
    }
    std::vector<int> indices;
    for (const auto& [index, address] : job.tasks()) {
      indices.push_back(index);
      const std::string task = absl::StrCat(job.name(), ":", index);
      absl::StatusOr<HostPort> hp = ParseHostPort(address);
      if (!hp.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(hp.status().message(), " for ", task));
      }
      if (hp->port == 0) continue;  // "any port": the task registers its real one
      auto [it, inserted] = used.emplace(address, task);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("duplicate address \"", address,
                                                       "\" used by ", it->second, " and ", task));
      }
    }
    std::sort(indices.begin(), indices.end());
    for (int i = 0; i < static_cast<int>(indices.size()); ++i) {
      if (indices[i] != i) {
        return absl::InvalidArgumentError(
            absl::StrCat("job \"", job.name(), "\" has no task ", i, " but has task ", indices[i],
                         "; task indices must be 0..", indices.size() - 1));
      }
    }
  }
  const int chiefs = NumTasks(spec, kChiefJob);
  if (chiefs == 0) {
    return absl::InvalidArgumentError("cluster has no \"chief\" task; exactly one is required");
  }
  if (chiefs > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("job \"chief\" has ", chiefs, " tasks; exactly one is allowed"));
  }
  if (NumTasks(spec, kPsJob) == 0) {
    return absl::InvalidArgumentError("cluster has no \"ps\" task; at least one is required");
  }
  if (NumTasks(spec, kEvaluatorJob) > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job \"evaluator\" has ", NumTasks(spec, kEvaluatorJob), " tasks; at most one is allowed"));
  }
  if (!config.has_task() || config.task().job().empty()) {
    return absl::InvalidArgumentError(
        "no task: say which task this process is (TF_CONFIG \"task\": {\"type\": ..., "
        "\"index\": ...}, or --job_name and --task_index)");
  }
  const v1::TaskId& task = config.task();
  if (!IsKnownJob(task.job())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown task type \"", task.job(), "\"; expected one of ", KnownJobsList()));
  }
  const int n = NumTasks(spec, task.job());
  if (task.job() == kEvaluatorJob && n == 0) {
    // TensorFlow runs the evaluator outside the cluster it evaluates.
    if (task.index() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("task index ", task.index(), " out of range for the evaluator; expected 0"));
    }
    return absl::OkStatus();
  }
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("task type \"", task.job(), "\" has no job in the cluster"));
  }
  if (task.index() < 0 || task.index() >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("task index ", task.index(), " out of range for job \"", task.job(),
                     "\" with ", n, " task", n == 1 ? "" : "s", " (expected 0..", n - 1, ")"));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<v1::ClusterConfig> ParseTfConfigUnvalidated(absl::string_view json) {
  Struct root;
  google::protobuf::util::JsonParseOptions options;
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &root, options);
  if (!parsed.ok()) {
    // The parser's message may quote the input over several lines; the first says it all.
    std::string why = parsed.message().ToString();
    why = why.substr(0, why.find('\n'));
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG is not a valid JSON object: ", why));
  }
  v1::ClusterConfig config;
  const auto& fields = root.fields();
  auto cluster_it = fields.find("cluster");
  if (cluster_it == fields.end()) {
    return absl::InvalidArgumentError("TF_CONFIG has no \"cluster\"");
  }
  if (cluster_it->second.kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError("TF_CONFIG \"cluster\" must be an object of job -> list");
  }
  for (const auto& [name, value] : cluster_it->second.struct_value().fields()) {
    PS_ASSIGN_OR_RETURN(v1::JobDef job, ParseJob(name, value));
    *config.mutable_cluster()->add_jobs() = std::move(job);
  }
  SortJobs(config.mutable_cluster());

  auto task_it = fields.find("task");
  if (task_it != fields.end() && task_it->second.kind_case() != Value::kNullValue) {
    if (task_it->second.kind_case() != Value::kStructValue) {
      return absl::InvalidArgumentError("TF_CONFIG \"task\" must be an object");
    }
    const auto& task = task_it->second.struct_value().fields();
    auto type_it = task.find("type");
    if (type_it == task.end() || type_it->second.kind_case() != Value::kStringValue) {
      return absl::InvalidArgumentError("TF_CONFIG \"task\" has no string \"type\"");
    }
    config.mutable_task()->set_job(type_it->second.string_value());
    auto index_it = task.find("index");
    if (index_it != task.end()) {
      PS_ASSIGN_OR_RETURN(int index, JsonIndex(index_it->second, "TF_CONFIG \"task.index\""));
      config.mutable_task()->set_index(index);
    }
  }
  for (const char* key : {"environment", "rpc_layer"}) {
    auto it = fields.find(key);
    if (it == fields.end()) continue;
    if (it->second.kind_case() != Value::kStringValue) {
      return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG \"", key, "\" must be a string"));
    }
    if (std::string(key) == "environment") {
      config.set_environment(it->second.string_value());
    } else {
      config.set_rpc_layer(it->second.string_value());
    }
  }
  return config;
}

}  // namespace

absl::StatusOr<v1::ClusterConfig> ParseTfConfig(absl::string_view json) {
  PS_ASSIGN_OR_RETURN(v1::ClusterConfig config, ParseTfConfigUnvalidated(json));
  PS_RETURN_IF_ERROR(ValidateClusterConfig(config));
  return config;
}

absl::StatusOr<v1::ClusterConfig> ResolveClusterConfig(const ClusterConfigSources& s) {
  v1::ClusterConfig config;
  const bool from_flags = !s.chief_hosts.empty() || !s.ps_hosts.empty() ||
                          !s.worker_hosts.empty() || !s.evaluator_hosts.empty();
  if (from_flags) {
    PS_ASSIGN_OR_RETURN(*config.mutable_cluster(), ParseHostFlags(s));
    if (s.job_name.empty() || s.task_index < 0) {
      return absl::InvalidArgumentError(
          "no task: with --ps_hosts/--worker_hosts/--chief_hosts, --job_name and "
          "--task_index are required");
    }
  } else if (!s.cluster_spec_file.empty() || !s.tf_config.empty()) {
    std::string json = s.tf_config;
    if (!s.cluster_spec_file.empty()) {
      PS_ASSIGN_OR_RETURN(json, ReadFile(s.cluster_spec_file));
    }
    // The task may come from the flags alone, so validation waits for the override below.
    PS_ASSIGN_OR_RETURN(config, ParseTfConfigUnvalidated(json));
  } else {
    return absl::InvalidArgumentError(
        "no cluster spec: set TF_CONFIG, or --cluster_spec_file, or --ps_hosts/--worker_hosts/"
        "--chief_hosts with --job_name and --task_index");
  }
  if (!s.job_name.empty()) config.mutable_task()->set_job(s.job_name);
  if (s.task_index >= 0) config.mutable_task()->set_index(s.task_index);
  PS_RETURN_IF_ERROR(ValidateClusterConfig(config));
  return config;
}

std::string ToTfConfigJson(const v1::ClusterConfig& config) {
  Struct root;
  Struct* cluster = (*root.mutable_fields())["cluster"].mutable_struct_value();
  for (const v1::JobDef& job : config.cluster().jobs()) {
    std::map<int, std::string> ordered(job.tasks().begin(), job.tasks().end());
    ListValue* list = (*cluster->mutable_fields())[job.name()].mutable_list_value();
    for (const auto& [index, address] : ordered) list->add_values()->set_string_value(address);
  }
  if (config.has_task()) {
    Struct* task = (*root.mutable_fields())["task"].mutable_struct_value();
    (*task->mutable_fields())["type"].set_string_value(config.task().job());
    (*task->mutable_fields())["index"].set_number_value(config.task().index());
  }
  if (!config.environment().empty()) {
    (*root.mutable_fields())["environment"].set_string_value(config.environment());
  }
  if (!config.rpc_layer().empty()) {
    (*root.mutable_fields())["rpc_layer"].set_string_value(config.rpc_layer());
  }
  std::string json;
  google::protobuf::util::MessageToJsonString(root, &json);
  return json;
}

}  // namespace pscluster
