# shellcheck shell=bash
# Sourced: the one way this repository's scripts start and stop a local cluster's tasks (the
# main job deploy/local/run.sh, bench/train_cluster.sh and the benchmarks built on it,
# bench/ps.sh, bench/gpu_smoke.sh, tests/netns_test.sh). Each task is a process of its own with
# TF_CONFIG set; the chief binds a port and writes it to a port file; every other task binds
# port 0 and registers its real address with the chief.
#
# The caller defines
#   launch NAME ARGS...   exec the binary NAME (chief, ps_server, worker, evaluator, ...) with
#                         ARGS: `exec`, so that the process the launcher signals and waits for
#                         is the task itself
# and sets
#   cl_dir                the folder of the tasks' logs (JOB-INDEX.log) and port files
#   cl_tls_dir            optional: a deploy/tls/make_certs.sh folder with a certificate for
#                         every task; each task then runs with its own (mutual TLS everywhere)
#
# What runs is in cl_pids (process ids) and cl_names (job:index), in the order started.
cl_pids=()
cl_names=()
cl_dir=${cl_dir:-}
cl_tls_dir=${cl_tls_dir:-}
# With cl_with_evaluator=1 the cluster has an evaluator task.
cl_with_evaluator=${cl_with_evaluator:-0}

# A holder's TLS flags (chief-0, ps-1, worker-0, psctl-viewer, ...) with cl_tls_dir; none
# without.
cl_tls_flags() {
  [[ -n $cl_tls_dir ]] || return 0
  echo "--tls_ca_file=$cl_tls_dir/ca.pem --tls_cert_file=$cl_tls_dir/$1.pem --tls_key_file=$cl_tls_dir/$1.key"
}

# TF_CONFIG for one task: the chief at CHIEF_ADDRESS, NUM_PS ps and NUM_WORKERS worker tasks
# on 127.0.0.1:0 (and an evaluator with cl_with_evaluator=1).
cl_tf_config() {  # chief_address job index num_ps num_workers
  local ps="" workers="" extra="" i
  for ((i = 0; i < $4; i++)); do ps+="${ps:+,}\"127.0.0.1:0\""; done
  for ((i = 0; i < $5; i++)); do workers+="${workers:+,}\"127.0.0.1:0\""; done
  [[ $cl_with_evaluator -eq 1 ]] && extra=',"evaluator":["127.0.0.1:0"]'
  printf '{"cluster":{"chief":["%s"],"ps":[%s],"worker":[%s]%s},"task":{"type":"%s","index":%d}}' \
    "$1" "$ps" "$workers" "$extra" "$2" "$3"
}

# cl_spawn NAME LOG TF_CONFIG COMMAND...: runs COMMAND in the background with TF_CONFIG set,
# its output in LOG, and remembers it as NAME. COMMAND is exec'd (a function, such as launch,
# must exec itself), so that its process is the one remembered.
cl_spawn() {
  local _cl_name=$1 _cl_log=$2 _cl_tf=$3
  shift 3
  (
    export TF_CONFIG="$_cl_tf"
    if [[ $(type -t "$1") == function ]]; then "$@"; else exec "$@"; fi
  ) >"$_cl_log" 2>&1 &
  cl_pids+=($!)
  cl_names+=("$_cl_name")
}

# cl_start_task BINARY JOB INDEX CHIEF_ADDRESS NUM_PS NUM_WORKERS [FLAGS...]: starts one task
# (`launch BINARY`, with its TLS flags, writing $cl_dir/JOB-INDEX.port) and waits until it has
# bound its port (30 s at most; then 1, with its log's end).
cl_start_task() {
  # (Names of its own: `launch` runs inside this function and may read the caller's globals.)
  local _cl_binary=$1 _cl_job=$2 _cl_index=$3 _cl_chief=$4 _cl_ps=$5 _cl_workers=$6 _
  shift 6
  local _cl_port="$cl_dir/$_cl_job-$_cl_index.port" _cl_log="$cl_dir/$_cl_job-$_cl_index.log"
  # A port file left by an earlier run in this folder would name a task that is gone.
  rm -f "$_cl_port"
  # shellcheck disable=SC2046
  cl_spawn "$_cl_job:$_cl_index" "$_cl_log" \
    "$(cl_tf_config "$_cl_chief" "$_cl_job" "$_cl_index" "$_cl_ps" "$_cl_workers")" \
    launch "$_cl_binary" --port_file="$_cl_port" $(cl_tls_flags "$_cl_job-$_cl_index") "$@"
  for _ in $(seq 600); do [[ -s $_cl_port ]] && return 0; sleep 0.05; done
  echo "cluster: $_cl_job:$_cl_index did not start; see $_cl_log" >&2
  tail -n 5 "$_cl_log" >&2
  return 1
}

# The chief's address once cl_start_task has started chief 0.
cl_chief_address() { echo "127.0.0.1:$(cat "$cl_dir/chief-0.port")"; }

# cl_wait [QUIET]: waits until every task has exited by itself; prints how each exited (unless
# QUIET, only those that did not exit 0, on stderr); returns 1 if one did not exit 0.
cl_wait() {
  local failed=0 i rc
  for i in "${!cl_pids[@]}"; do
    rc=0
    wait "${cl_pids[$i]}" || rc=$?
    if [[ $rc -ne 0 ]]; then
      echo "cluster: ${cl_names[$i]} exited $rc; see ${cl_dir:-its log}" >&2
      failed=1
    elif [[ -z ${1:-} ]]; then
      echo "    ${cl_names[$i]} exited 0"
    fi
  done
  cl_pids=()
  cl_names=()
  return $failed
}

# cl_stop [QUIET]: stops every task with SIGTERM, then cl_wait.
cl_stop() {
  local i
  for i in "${!cl_pids[@]}"; do kill -TERM "${cl_pids[$i]}" 2>/dev/null || true; done
  cl_wait "$@"
}

# cl_await_exit SECONDS: waits until every task has exited by itself, SECONDS at most. Returns
# 1 as soon as one exits non-zero (naming it), or when some still run after SECONDS; those
# that exited are forgotten, those still running remain (cl_stop them).
cl_await_exit() {
  local deadline=$((SECONDS + $1)) i rc
  while [[ ${#cl_pids[@]} -gt 0 ]]; do
    for i in "${!cl_pids[@]}"; do
      kill -0 "${cl_pids[$i]}" 2>/dev/null && continue
      rc=0
      wait "${cl_pids[$i]}" || rc=$?
      local name=${cl_names[$i]}
      unset 'cl_pids[i]' 'cl_names[i]'
      if [[ $rc -ne 0 ]]; then
        echo "cluster: $name exited $rc; see ${cl_dir:-its log}" >&2
        return 1
      fi
    done
    [[ ${#cl_pids[@]} -eq 0 ]] && break
    if ((SECONDS >= deadline)); then
      echo "cluster: still running after $1 s: ${cl_names[*]}" >&2
      return 1
    fi
    sleep 0.2
  done
  cl_pids=()
  cl_names=()
}
