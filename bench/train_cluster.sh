# shellcheck shell=bash disable=SC2154
# Sourced by bench/train.sh and bench/gpu_train.sh: start a local training cluster (1 chief,
# N ps, M workers, each its own process on 127.0.0.1, TF_CONFIG as in deploy/local/run.sh),
# measure its steady-state examples/s, stop it with SIGTERM and check that every task exits 0.
#
# The caller defines:
#   launch NAME ARGS...   exec the binary NAME (chief, ps_server, worker, cluster_probe) with
#                         ARGS (cl_private_bins below defines it from built binaries)
#   work                  a folder for logs
#   rate_py               the path of bench/train_rate.py
# and may set cl_model (model config file), cl_data_path (Fashion-MNIST folder, "" for the
# default), cl_chief_flags (an array of extra chief flags) and cl_tls_dir (a
# deploy/tls/make_certs.sh folder with a certificate for every task: each task then runs with
# its own, every channel on mutual TLS, the tensor data plane included; cluster_probe uses
# psctl-viewer's).
#
# Two kinds of run: cl_start + cl_measure + cl_stop (a timed window of steady-state training,
# then SIGTERM), and cl_train_to_end (every epoch to the end, with an evaluator task, the final
# test accuracy; the chief's --exit_after_training ends the run).

# cl_ours_flags RUN CERTS: sets cl_chief_flags, cl_worker_flags and cl_tls_dir for one of our
# runs named as bench/gpu_*.sh's --ours names them: plaintext, tls, async (a push every step),
# sync (SyncReplicas: every worker's gradient of a step averaged, then applied once; sets
# cl_mode, async for the others), local<K> (the chief's --local_steps=K), with suffixes _tls (mutual TLS, the certificates in CERTS), _nographs (the
# worker's --cuda_graphs=false), _fp16 / _bf16 (its --wire_dtype) and _r2 (the chief's
# --replication=2: every dense partition also on a backup ps task), e.g. local8_fp16_tls.
cl_ours_flags() {
  local run=$1 certs=$2
  cl_chief_flags=()
  cl_worker_flags=()
  cl_tls_dir=""
  cl_mode=async
  if [[ $run == sync* ]]; then cl_mode=sync; fi
  if [[ $run == tls || $run == *_tls* ]]; then cl_tls_dir=$certs; fi
  if [[ $run =~ ^local([0-9]+) ]]; then cl_chief_flags=(--local_steps="${BASH_REMATCH[1]}"); fi
  if [[ $run == *_nographs* ]]; then cl_worker_flags+=(--cuda_graphs=false); fi
  if [[ $run == *_fp16* ]]; then cl_worker_flags+=(--wire_dtype=float16); fi
  if [[ $run == *_bf16* ]]; then cl_worker_flags+=(--wire_dtype=bfloat16); fi
  if [[ $run == *_r2* ]]; then cl_chief_flags+=(--replication=2); fi
  return 0
}

# cl_private_bins BIN_DIR PATH...: copies built binaries (bazel-bin relative paths) into
# $work/bin, since another build in this workspace may replace the outputs mid-run, and defines
# `launch` to run them.
cl_private_bins() {
  local bin_dir=$1 b
  shift
  mkdir -p "$work/bin"
  for b in "$@"; do cp "$bin_dir/$b" "$work/bin/"; done
  launch() { local name=$1; shift; exec "$work/bin/$name" "$@"; }
}

# cl_from_bundle BUNDLE: runs the binaries of a device bundle (bench/gpu_prepare.sh) instead:
# unpacks its payload into $work/payload and sets `launch`, `runner`, `rate_py` and
# `cl_data_path` (the bundle's Fashion-MNIST) from it.
cl_from_bundle() {
  local bundle=$1
  mkdir -p "$work/payload"
  tar -C "$work/payload" -xzf "$bundle/payload.tar.gz"
  runner=$work/payload/run
  launch() { exec "$runner" "$@"; }
  rate_py=$bundle/bench/train_rate.py
  cl_data_path=$bundle/data
}

# cl_exit_trap SCRIPT: on exit, stops a cluster still running and deletes $work, unless the
# run failed, $status is non-zero or $keep_logs is 1; Ctrl-C ends the script.
cl_exit_trap() {
  cl_script=$1
  cl_on_exit() {
    local rc=$?
    if [[ ${#cl_pids[@]} -gt 0 ]]; then cl_stop || true; fi
    if [[ $rc -eq 0 && ${status:-0} -eq 0 && ${keep_logs:-0} -eq 0 ]]; then
      rm -rf "$work"
    else
      echo "==> logs kept in $work"
    fi
  }
  trap cl_on_exit EXIT
  trap 'echo; echo "$cl_script: interrupted"; exit 130' INT TERM
}

# Starting, stopping and TF_CONFIG: the launcher every script of the repository shares.
# shellcheck source=deploy/local/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/../deploy/local/cluster.sh"
cl_chief=""
cl_num_workers=0
cl_model=${cl_model:-configs/mlp.pbtxt}
cl_data_path=${cl_data_path:-}

# The chief's ClusterStatus as one line of JSON (what `psctl status --json` is built on).
# shellcheck disable=SC2046
cl_status() { (launch cluster_probe --chief="$cl_chief" $(cl_tls_flags psctl-viewer)); }

# cl_start NAME MODE NUM_PS NUM_WORKERS BATCH EPOCHS DEVICE
# DEVICE is every worker's --device; "{i}" in it becomes the worker's index (gpu:{i}: worker i
# on GPU i). The arrays cl_chief_flags, cl_ps_flags and cl_worker_flags, when set, are added to
# the chief's, every ps task's and every worker's flags.
cl_start() {
  local name=$1 mode=$2 num_ps=$3 num_workers=$4 batch=$5 epochs=$6 device=$7 i
  cl_dir="$work/$name"
  cl_num_workers=$num_workers
  mkdir -p "$cl_dir"
  local data_flag=()
  [[ -n $cl_data_path ]] && data_flag=(--data_path="$cl_data_path")
  # No evaluation while measuring: it would take the cores from the workers.
  cl_start_task chief chief 0 "127.0.0.1:0" "$num_ps" "$num_workers" \
    --model_config="$cl_model" --mode="$mode" --epochs="$epochs" --batch_size="$batch" \
    --eval_every_secs=1000000 --metrics_file="$cl_dir/metrics.jsonl" \
    ${data_flag[@]+"${data_flag[@]}"} ${cl_chief_flags[@]+"${cl_chief_flags[@]}"} || return 1
  cl_chief=$(cl_chief_address)
  for ((i = 0; i < num_ps; i++)); do
    cl_start_task ps_server ps "$i" "$cl_chief" "$num_ps" "$num_workers" \
      ${cl_ps_flags[@]+"${cl_ps_flags[@]}"} || return 1
  done
  for ((i = 0; i < num_workers; i++)); do
    cl_start_task worker worker "$i" "$cl_chief" "$num_ps" "$num_workers" \
      --device="${device//\{i\}/$i}" \
      ${data_flag[@]+"${data_flag[@]}"} ${cl_worker_flags[@]+"${cl_worker_flags[@]}"} || return 1
  done
  # Training has started once every worker has reported a step (async: every 2 s).
  local _ steps
  for _ in $(seq 600); do
    steps=$(cl_status 2>/dev/null | python3 -c '
import json, sys
try:
    p = json.load(sys.stdin).get("progress", {})
except ValueError:
    sys.exit(0)
w = [int(x) for x in p.get("worker_steps", p.get("workerSteps", []))]
print("ok" if w and min(w) > 0 else "")' || true)
    [[ $steps == ok ]] && return 0
    sleep 0.2
  done
  echo "train_cluster: $name: the workers did not start training in 120 s; see $cl_dir" >&2
  return 1
}

# cl_train_to_end NAME MODE NUM_PS NUM_WORKERS BATCH EPOCHS DEVICE TIMEOUT [EVALUATOR]
# Trains every worker's EPOCHS epochs to the end and waits (TIMEOUT s at most) for every task
# to exit 0: the chief runs with --exit_after_training (no checkpoints), so once the workers are
# done and the final model is evaluated it tells every task to stop. With EVALUATOR 1 (the
# default; the caller's `launch` must know the evaluator binary) an evaluator task evaluates
# the live model every $cl_eval_every s (default 30) and the final one, on the first worker's
# device; with 0 the chief does (on its CPU).
# cl_evaluator_flags (an array), when set, replaces the evaluator's --eval_every_secs (e.g.
# --eval_every_steps=N). With cl_target_accuracy set, the run ends (SIGTERM, every task must exit
# 0) as soon as an evaluation reaches that test accuracy: cl_time_to_accuracy below then says
# when. Prints progress every 30 s. Writes $cl_dir/evaluations (`step accuracy loss by` per
# evaluation) and $cl_dir/final, one line
#   FINAL test_accuracy=A test_loss=L step=S seconds=T finished=1|0
# (finished=0: the timeout or a failure stopped it; the figures are the last evaluation's;
# finished=1 also when cl_target_accuracy was reached and the tasks exited 0 on SIGTERM).
# Returns 1 when the run did not finish or a task exited non-zero.
cl_train_to_end() {
  local name=$1 mode=$2 num_ps=$3 num_workers=$4 batch=$5 epochs=$6 device=$7 timeout=$8
  local cl_with_evaluator=${9:-1} i t0=$SECONDS last_report=$SECONDS chief_gone="" rc failed=0
  local eval_every=${cl_eval_every:-30}
  cl_dir="$work/$name"
  cl_num_workers=$num_workers
  mkdir -p "$cl_dir"
  : >"$cl_dir/evaluations"
  echo "FINAL test_accuracy=n/a test_loss=n/a step=n/a seconds=0 finished=0" >"$cl_dir/final"
  local data_flag=() chief_eval=(--eval_every_secs="$eval_every")
  [[ -n $cl_data_path ]] && data_flag=(--data_path="$cl_data_path")
  [[ $cl_with_evaluator -eq 1 ]] && chief_eval=(--final_eval_timeout_secs=600)
  local started=0
  cl_start_task chief chief 0 "127.0.0.1:0" "$num_ps" "$num_workers" \
    --model_config="$cl_model" --mode="$mode" --epochs="$epochs" --batch_size="$batch" \
    --exit_after_training --metrics_file="$cl_dir/metrics.jsonl" "${chief_eval[@]}" \
    ${data_flag[@]+"${data_flag[@]}"} ${cl_chief_flags[@]+"${cl_chief_flags[@]}"} && started=1
  if [[ $started -eq 1 ]]; then
    cl_chief=$(cl_chief_address)
    for ((i = 0; i < num_ps; i++)); do
      cl_start_task ps_server ps "$i" "$cl_chief" "$num_ps" "$num_workers" \
        ${cl_ps_flags[@]+"${cl_ps_flags[@]}"} || { started=0; break; }
    done
  fi
  for ((i = 0; started == 1 && i < num_workers; i++)); do
    cl_start_task worker worker "$i" "$cl_chief" "$num_ps" "$num_workers" \
      --device="${device//\{i\}/$i}" \
      ${data_flag[@]+"${data_flag[@]}"} ${cl_worker_flags[@]+"${cl_worker_flags[@]}"} ||
      started=0
  done
  if [[ $started -eq 1 && $cl_with_evaluator -eq 1 ]]; then
    # The evaluator computes on the first worker's device (a GPU is shared: it evaluates
    # while the worker trains).
    local eval_device=${device//\{i\}/0}
    eval_device=${eval_device%%,*}
    local evaluator_flags=(--eval_every_secs="$eval_every")
    [[ -n ${cl_evaluator_flags[*]:-} ]] && evaluator_flags=("${cl_evaluator_flags[@]}")
    cl_start_task evaluator evaluator 0 "$cl_chief" "$num_ps" "$num_workers" \
      "${evaluator_flags[@]}" --device="$eval_device" \
      ${data_flag[@]+"${data_flag[@]}"} || started=0
  fi
  if [[ $started -eq 0 ]]; then
    cl_stop || true
    return 1
  fi
  cl_evaluations() {  # the chief's evaluation lines -> `step accuracy loss by`
    sed -nE 's/.*evaluation at step ([0-9]+) by (.+): test loss ([-0-9.naif]+), accuracy ([-0-9.naif]+).*/\1 \4 \3 \2/p' \
      "$cl_dir/chief-0.log" 2>/dev/null
  }
  local finished=0 alive
  while true; do
    alive=0
    for i in "${!cl_pids[@]}"; do kill -0 "${cl_pids[$i]}" 2>/dev/null && alive=$((alive + 1)); done
    if [[ $alive -eq 0 ]]; then finished=1; break; fi
    if ! kill -0 "${cl_pids[0]}" 2>/dev/null; then  # the chief is gone, others are not
      [[ -n $chief_gone ]] || chief_gone=$SECONDS
      if ((SECONDS - chief_gone > 60)); then
        echo "train_cluster: $name: the chief exited 60 s ago and $alive task(s) still run" >&2
        break
      fi
    fi
    if ((SECONDS - t0 >= timeout)); then
      echo "train_cluster: $name: not finished after $timeout s: stopping it" >&2
      break
    fi
    if [[ -n ${cl_target_accuracy:-} ]] && cl_time_to_accuracy "$cl_target_accuracy" >/dev/null
    then
      echo "    test accuracy $cl_target_accuracy reached: stopping the cluster"
      cl_stop || failed=1
      finished=1
      break
    fi
    if ((SECONDS - last_report >= 30)); then
      last_report=$SECONDS
      echo "    $((SECONDS - t0)) s: $(grep -hoE 'worker:[0-9]+ step [0-9]+ epoch [0-9/]+ loss [-0-9.naif]+' \
        "$cl_dir"/worker-*.log 2>/dev/null | tail -1); last evaluation (step accuracy):" \
        "$(cl_evaluations | tail -1 | cut -d' ' -f1,2)"
    fi
    sleep 1
  done
  local seconds=$((SECONDS - t0))
  if [[ $finished -eq 1 && ${#cl_pids[@]} -gt 0 ]]; then
    cl_wait || failed=1
  elif [[ $finished -eq 0 ]]; then
    cl_stop || true
    failed=1
  fi
  cl_evaluations >"$cl_dir/evaluations"
  local acc acc_last loss step
  acc=$(sed -nE 's/.*training finished: final test accuracy ([-0-9.naif]+).*/\1/p' \
    "$cl_dir/chief-0.log" | tail -1)
  [[ -n $acc || -n ${cl_target_accuracy:-} ]] || finished=0
  read -r step acc_last loss _ <<<"$(tail -1 "$cl_dir/evaluations")" || true
  [[ -n $acc ]] || acc=${acc_last:-}
  echo "FINAL test_accuracy=${acc:-n/a} test_loss=${loss:-n/a} step=${step:-n/a}" \
    "seconds=$seconds finished=$finished" | tee "$cl_dir/final"
  [[ $finished -eq 1 && $failed -eq 0 ]]
}

# cl_time_to_accuracy TARGET: from the chief's log of the current run, the first evaluation
# whose test accuracy is at least TARGET, as `seconds step accuracy evaluations` (seconds: the
# training time its model was read at, the chief's clock since the first step report, so no
# evaluation is counted; evaluations: how many there were up to it). Returns 1 if none.
cl_time_to_accuracy() {
  sed -nE 's/.*evaluation at step ([0-9]+) by .+: test loss [^,]+, accuracy ([-0-9.naif]+).*\(model read at ([0-9.]+) s of training\).*/\3 \1 \2/p' \
    "$cl_dir/chief-0.log" 2>/dev/null |
    awk -v t="$1" '{ n++ } $3 >= t { print $1, $2, $3, n; found = 1; exit } END { exit !found }'
}

# CPU seconds (user + system) each task has used so far: lines `job:index seconds`, then
# `machine seconds` for every process of the machine together.
cl_cpu() {
  local i f tck
  tck=$(getconf CLK_TCK)
  for i in "${!cl_pids[@]}"; do
    # Fields 14 and 15 of /proc/PID/stat (after the parenthesized name): utime, stime.
    f=$(sed 's/^.*) //' "/proc/${cl_pids[$i]}/stat" 2>/dev/null | awk '{print $12 + $13}')
    echo "${cl_names[$i]} $(awk -v t="${f:-0}" -v k="$tck" 'BEGIN {printf "%.3f", t / k}')"
  done
  # The whole machine (every process, ours and others'): busy = all but idle and iowait.
  awk -v k="$tck" '$1 == "cpu" {printf "machine %.3f\n", ($2 + $3 + $4 + $7 + $8 + $9) / k}' \
    /proc/stat
}

# cl_measure WARMUP SECONDS BATCH MODE: after WARMUP s of training, measures SECONDS s (whole
# seconds), sampling the chief's ClusterStatus every 2 s and the tasks' CPU time at both ends;
# prints the RATE line of train_rate.py (and keeps it in $cl_dir/rate).
cl_measure() {
  local warmup=$1 seconds=$2 batch=$3 mode=$4 t0 t1 now left logs=() i
  sleep "$warmup"
  local samples="$cl_dir/status_samples"
  : >"$samples"
  sample() { { printf '%s ' "$(date +%s.%N)"; cl_status | tr -d '\n'; echo; } >>"$samples"; }
  cl_cpu >"$cl_dir/cpu0"
  t0=$(date +%s%N)
  t1=$((t0 + ${seconds%.*} * 1000000000))
  while true; do
    sample
    now=$(date +%s%N)
    ((now + 2000000000 < t1)) || break
    sleep 2
  done
  left=$((t1 - $(date +%s%N)))
  ((left > 0)) && sleep "$((left / 1000000000)).$(printf '%09d' $((left % 1000000000)))"
  sample
  cl_cpu >"$cl_dir/cpu1"
  for ((i = 0; i < cl_num_workers; i++)); do logs+=("$cl_dir/worker-$i.log"); done
  local sync_flag=()
  [[ $mode == sync ]] && sync_flag=(--sync)
  python3 "$rate_py" --t0="$((t0 / 1000000000)).$(printf '%09d' $((t0 % 1000000000)))" \
    --t1="$((t1 / 1000000000)).$(printf '%09d' $((t1 % 1000000000)))" --batch="$batch" \
    --status_samples="$samples" --cpu0="$cl_dir/cpu0" --cpu1="$cl_dir/cpu1" \
    ${sync_flag[@]+"${sync_flag[@]}"} "${logs[@]}" |
    tee "$cl_dir/rate"
}

# kv KEY FILE: the value of KEY=... on the RATE/TRAIN_BENCH line of FILE.
kv() { grep -o "\b$1=[^ ]*" "$2" | tail -1 | cut -d= -f2; }
