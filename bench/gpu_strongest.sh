#!/usr/bin/env bash
# The strongest single-GPU PyTorch baselines, on the GPU machine, in one call: for each spec
# "<model> <batch>" (a config of configs/ and its batch size), bench/torch_cnn.py's speed mode
# (--warmup seconds, then --seconds timed) in each --capture mode: none (eager), graph (the
# whole training step in one CUDA graph) and compile_graph (torch.compile'd model, then the
# same), --repeats times each (none, graph, compile_graph, none, ...). Prints each run's
# examples/s, then per spec and mode the median, the spread ((max - min) / median) and
#   BENCH torch_<model>_b<B>_<capture> <median ex/s> ex/s
# A spec with a third field, "<model> <batch> <ps tasks>", also measures ours in the same
# rotation (before PyTorch's modes): a local cluster of 1 chief, the ps tasks and one worker
# --device=gpu:0, async, --seconds of steady state after --warmup (bench/train_cluster.sh), in
# plaintext, and with --tls also with mutual TLS on every channel (the bundle's certificates);
# then per spec
#   BENCH gpu_strongest_<model>_b<B>_<run> <median ex/s> ex/s
#         ratio=<ours / the faster of graph and compile_graph's medians>
# where the runs of ours are plaintext (and tls with --tls), or those --ours lists: plaintext,
# tls, local<K> (the chief's --local_steps=K) and the suffixes of bench/train_cluster.sh's
# cl_ours_flags: _tls, _nographs (kernels launched one by one), _fp16 / _bf16 (on the wire),
# _r2 (--replication=2).
# From the device bundle (bench/gpu_prepare.sh), on the device machine:
#   bash .devbundle/bench/gpu_strongest.sh [--seconds 10] [--warmup 3] [--repeats 3]
#        [--specs "mlp 1024;cnn 128;resnet20 128"] [--modes "none graph compile_graph"]
#        [--compile_mode default] [--timeout 300] [--tls] [--ours "plaintext local8"]
# --specs: "<config name> <batch> [<ps tasks>]" runs, separated by ';'. --compile_mode: torch.compile's mode
# for compile_graph (default, or max-autotune-no-cudagraphs: slower to compile). Every run is
# cut off after --timeout s (timeout(1)); a failing or cut-off run is reported, the others go
# on, and the exit status is then 1. PYTHON: the python with PyTorch (default python3). With
# $OUT set the report and a tarball of every run's output are also written there.
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)
seconds=10
warmup=3
repeats=3
specs="mlp 1024;cnn 128;resnet20 128"
modes="none graph compile_graph"
compile_mode=default
run_timeout=300
ours_modes="plaintext"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --specs) specs=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --compile_mode) compile_mode=$2; shift 2 ;;
    --timeout) run_timeout=$2; shift 2 ;;
    --tls) ours_modes="plaintext tls"; shift ;;
    --ours) ours_modes=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "gpu_strongest.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$repeats" "$run_timeout"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "gpu_strongest.sh: not a number: $n" >&2; exit 2; }
done
python=${PYTHON:-python3}
for f in bench/torch_cnn.py data/train-images-idx3-ubyte.gz data/train-labels-idx1-ubyte.gz; do
  [[ -e $bundle/$f ]] ||
    { echo "gpu_strongest.sh: $bundle/$f is missing; run bench/gpu_prepare.sh" >&2; exit 1; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_strongest.XXXXXX")
report=$work/gpu_strongest.txt
say() { echo "$@" | tee -a "$report"; }
# Ours (specs with ps tasks): the bundle's binaries and bench/train_cluster.sh.
# shellcheck source=bench/train_cluster.sh
source "$bundle/bench/train_cluster.sh"
[[ -f $bundle/payload.tar.gz ]] && cl_from_bundle "$bundle"
# shellcheck disable=SC2317  # run by the EXIT trap
finish() {
  local rc=$?
  if [[ ${#cl_pids[@]} -gt 0 ]]; then cl_stop || true; fi
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
    cp "$report" "$OUT/" 2>/dev/null || true
    tar -C "$work" -czf "$OUT/gpu_strongest_logs.tar.gz" . 2>/dev/null || true
  fi
  echo "==> logs in $work"
  exit "$rc"
}
trap finish EXIT

torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1 || true)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
say "==> $(date -u +%F) PyTorch $torch_version on ${gpu:-no GPU}, $(nproc) cores;" \
  "${warmup} s warm-up, ${seconds} s timed, $repeats repeats, compile mode $compile_mode," \
  "at most $run_timeout s a run"

status=0
IFS=';' read -r -a spec_list <<<"$specs"
read -r -a mode_list <<<"$modes"
for spec in "${spec_list[@]}"; do
  read -r name batch num_ps <<<"$spec"
  [[ -n $name && $batch =~ ^[0-9]+$ && $num_ps =~ ^[0-9]*$ ]] ||
    { say "==> bad spec '$spec' (want '<config name> <batch> [<ps tasks>]')"; status=1; continue; }
  model=$bundle/configs/$name.pbtxt
  [[ -f $model ]] || { say "==> $name: no $model"; status=1; continue; }
  if [[ -n $num_ps && -z ${runner:-} ]]; then
    say "==> $name: no payload.tar.gz in $bundle to measure ours"; status=1; num_ps=""
  fi
  declare -A rates=() notes=()
  for ((r = 1; r <= repeats; r++)); do
    for ours in ${num_ps:+$ours_modes}; do
      # The ps count in the name: two specs of one model and batch must not share a folder.
      run=${name}_b${batch}_${num_ps}ps_ours_${ours}_$r
      cl_model=$model
      cl_ours_flags "$ours" "$bundle/certs"
      # (cl_ours_flags sets cl_mode: sync for the sync runs, async for the others.)
      if ! cl_start "$run" "$cl_mode" "$num_ps" 1 "$batch" 1000 "${DEVICE:-gpu:0}" >/dev/null ||
        ! cl_measure "$warmup" "$seconds" "$batch" "$cl_mode" >/dev/null; then
        say "    $run: FAILED; logs in $cl_dir"
        status=1
        cl_stop >/dev/null || true
        continue
      fi
      cl_stop >/dev/null || status=1
      rate=$(kv examples_per_second "$cl_dir/rate")
      rates[ours_$ours]="${rates[ours_$ours]:-} $rate"
      say "    $run: $rate examples/s (1 worker on ${DEVICE:-gpu:0}, $num_ps ps, $cl_mode)"
    done
    for mode in "${mode_list[@]}"; do
      run=${name}_b${batch}_${mode}_$r
      rc=0
      timeout -k 10 "$run_timeout" "$python" "$bundle/bench/torch_cnn.py" --model="$model" \
        --data="$bundle/data" --batch_size="$batch" --capture="$mode" \
        --compile_mode="$compile_mode" --warmup_seconds="$warmup" --seconds="$seconds" \
        >"$work/$run.out" 2>"$work/$run.err" || rc=$?
      line=$(grep '^TORCH_CNN ' "$work/$run.out" | tail -1 || true)
      rate=$(grep -o '\bexamples_per_second=[^ ]*' <<<"$line" | cut -d= -f2 || true)
      if [[ $rc -ne 0 || -z $rate ]]; then
        what="FAILED (exit $rc)"
        [[ $rc -eq 124 || $rc -eq 137 ]] && what="cut off after $run_timeout s"
        say "    $run: $what; $(tail -1 "$work/$run.err" 2>/dev/null | cut -c1-300)"
        status=1
        continue
      fi
      rates[$mode]="${rates[$mode]:-} $rate"
      notes[$mode]=$(grep -o '\b\(adam\|augment\|last_batch\|capture_seconds\|setup_seconds\)=[^ ]*' \
        <<<"$line" | tr '\n' ' ')
      say "    $run: $rate examples/s (${notes[$mode]% })"
    done
  done
  for mode in "${mode_list[@]}"; do
    python3 - "$name" "$batch" "$mode" "${rates[$mode]:-}" "${rates[none]:-}" \
      "${notes[$mode]:-}" <<'PY' | tee -a "$report"
import statistics, sys
name, batch, mode, runs, eager, note = sys.argv[1:7]
runs, eager = [float(v) for v in runs.split()], [float(v) for v in eager.split()]
if not runs:
    print("    %s b%s %s: no successful run" % (name, batch, mode))
    sys.exit(0)
m = statistics.median(runs)
vs = " (x%.2f eager)" % (m / statistics.median(eager)) if eager and mode != "none" else ""
print("    %s b%s %s: median %.0f ex/s%s, spread %.1f%% (min %.0f, max %.0f; %d runs) %s"
      % (name, batch, mode, m, vs, 100 * (max(runs) - min(runs)) / m, min(runs), max(runs),
         len(runs), note.strip()))
print("BENCH torch_%s_b%s_%s %.0f ex/s" % (name, batch, mode, m))
PY
  done
  for ours in ${num_ps:+$ours_modes}; do
    python3 - "$name" "$batch" "$ours" "${rates[ours_$ours]:-}" "${rates[graph]:-}" \
      "${rates[compile_graph]:-}" <<'PY' | tee -a "$report"
import statistics, sys
name, batch, ours = sys.argv[1:4]
runs, graph, compiled = ([float(v) for v in a.split()] for a in sys.argv[4:7])
if not runs:
    print("    %s b%s ours %s: no successful run" % (name, batch, ours))
    sys.exit(0)
m = statistics.median(runs)
best = max([statistics.median(x) for x in (graph, compiled) if x] or [0])
ratio = "%.3g" % (m / best) if best else "n/a"
print("    %s b%s ours (%s): median %.0f ex/s, spread %.1f%% (%d runs); strongest PyTorch %.0f"
      % (name, batch, ours, m, 100 * (max(runs) - min(runs)) / m, len(runs), best))
print("BENCH gpu_strongest_%s_b%s_%s %.0f ex/s ratio=%s" % (name, batch, ours, m, ratio))
PY
  done
  unset rates notes
done
exit $status
