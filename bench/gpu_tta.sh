#!/usr/bin/env bash
# Time to accuracy, ours against the strongest PyTorch on one or more GPUs, in one call: for
# each spec "<model> <batch> <ps tasks> <target> <max epochs>",
#   ours: a local cluster (1 chief, the ps tasks, N workers, worker i --device=gpu:i, async, and an
#         evaluator on the same GPU evaluating the live model every half epoch's steps,
#         --eval_every_steps; the worker reports its steps every 10 ms) trained until an
#         evaluation reaches the target test accuracy
#         (then stopped) or for max epochs; its time is the training time at which the
#         evaluated model was read (the chief's clock since the first step report: start-up
#         and evaluation are not counted, but the evaluator shares the GPU while training runs);
#   PyTorch: bench/torch_cnn.py --target_accuracy in each --modes mode (the clock
#         stopped while it evaluates, every --eval_every_examples=30000 examples; warm-up,
#         compile and capture before the clock starts): none (eager), graph, compile_graph on
#         one GPU, and ddp<G>_<none|graph|compile_graph>: DistributedDataParallel on G GPUs
#         under torchrun, <batch> per GPU (bench/torch_cnn.py --ddp: static graph, the
#         all-reduce captured in the graph; 30000 examples counted over every GPU),
# --repeats times each (ours, then each mode, then again). Prints each run and per spec
#   BENCH gpu_tta_<model>_<N>gpu_ours_<run> <median s> s ratio=<best PyTorch median s / ours>
#   BENCH torch_tta_<model>_b<B>_<mode> <median s> s
# where the best PyTorch is the fastest of every mode run, on any number of GPUs.
# with the examples/s each side trained at and the accuracy it reached (a run that does not
# reach the target counts as inf; a PyTorch run that fails does not count). From the device bundle (bench/gpu_prepare.sh), there:
#   bash .devbundle/bench/gpu_tta.sh [--repeats 1] [--modes "graph compile_graph"]
#        [--specs "mlp 128 1 0.885 20;cnn 128 2 0.90 15;resnet20 128 2 0.92 30"]
#        [--timeout 600] [--ours "async local8"] [--workers "1 2 4"]
# --ours lists our runs: async (a push every step), sync (SyncReplicas: one update a step from
# every worker's gradient, averaged: DDP's arithmetic) and local<K> (the chief's --local_steps=K),
# with the suffixes of bench/train_cluster.sh's cl_ours_flags (_tls, _nographs, _fp16, _bf16).
# --workers "N ...": each run of ours with N workers, worker i on GPU i (the BENCH line says
# <N>gpu), for each N listed (default 1); PyTorch's GPUs are in its modes. A run suffixed
# _towers<T> (e.g. local16_towers2) has one worker on GPUs 0..T-1 instead (its --device lists
# them: each step's batch of <batch> per GPU split over them, gradients all-reduced with NCCL,
# DDP's arithmetic inside the worker); the BENCH line says <T>gpu. Only with --workers 1.
# --seeds "S1 S2 ...": repeat r draws from seed S_r on both sides, instead of seed 1 every time
# (then --repeats is the number of seeds): the model's initial values (the config's `seed`, in a
# copy of it; torch_cnn.py --seed) and the order of the examples (the chief's --shuffle_seed;
# PyTorch's shuffle follows its seed), so that the times and epochs to the target show how
# much they move with the draw.
# Every run is cut off after --timeout s. With $OUT set the report and a tarball of every run's
# logs are also written there. DEVICE (default gpu:0) and PYTHON (default python3) as usual.
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)
repeats=1
modes="graph compile_graph"
specs="mlp 128 1 0.885 20;cnn 128 2 0.90 15;resnet20 128 2 0.92 30"
run_timeout=600
ours_runs=async
num_workers=1
seeds=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repeats) repeats=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --specs) specs=$2; shift 2 ;;
    --timeout) run_timeout=$2; shift 2 ;;
    --ours) ours_runs=$2; shift 2 ;;
    --workers) num_workers=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "gpu_tta.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
read -r -a worker_counts <<<"$num_workers"
read -r -a seed_list <<<"$seeds"
[[ ${#seed_list[@]} -gt 0 ]] && repeats=${#seed_list[@]}
for n in "$repeats" "$run_timeout" "${worker_counts[@]}" "${seed_list[@]}"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "gpu_tta.sh: not a number: $n" >&2; exit 2; }
done
read -r -a mode_list <<<"$modes"
for mode in "${mode_list[@]}"; do
  [[ $mode =~ ^(ddp[0-9]+_)?(none|graph|compile_graph)$ ]] ||
    { echo "gpu_tta.sh: --modes takes none, graph, compile_graph and ddp<G>_<one of them>, not $mode" >&2; exit 2; }
done
read -r -a ours_list <<<"$ours_runs"
for o in "${ours_list[@]}"; do
  [[ $o =~ ^(async|sync|local[0-9]+)(_tls|_nographs|_fp16|_bf16|_towers[0-9]+)*$ ]] ||
    { echo "gpu_tta.sh: --ours takes async, sync and local<K> (with _tls, _nographs, _fp16, _bf16 or _towers<T>), not $o" >&2; exit 2; }
  if [[ $o =~ _towers([0-9]+) ]] && [[ ${BASH_REMATCH[1]} -lt 1 || $num_workers != 1 ]]; then
    echo "gpu_tta.sh: $o: towers need --workers 1 and at least one tower" >&2
    exit 2
  fi
done
python=${PYTHON:-python3}
for f in payload.tar.gz bench/torch_cnn.py data/t10k-images-idx3-ubyte.gz; do
  [[ -e $bundle/$f ]] ||
    { echo "gpu_tta.sh: $bundle/$f is missing; run bench/gpu_prepare.sh" >&2; exit 1; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_tta.XXXXXX")
report=$work/gpu_tta.txt
# shellcheck source=bench/train_cluster.sh
source "$bundle/bench/train_cluster.sh"
cl_from_bundle "$bundle"
say() { echo "$@" | tee -a "$report"; }
# shellcheck disable=SC2317  # run by the EXIT trap
finish() {
  local rc=$?
  if [[ ${#cl_pids[@]} -gt 0 ]]; then cl_stop || true; fi
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
    cp "$report" "$OUT/" 2>/dev/null || true
    tar -C "$work" --exclude=payload -czf "$OUT/gpu_tta_logs.tar.gz" . 2>/dev/null || true
  fi
  echo "==> logs in $work"
  exit "$rc"
}
trap finish EXIT

say "==> $(date -u +%F) $("$runner" chief --version | head -1), PyTorch" \
  "$("$python" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1) on" \
  "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(nproc) cores"

status=0
IFS=';' read -r -a spec_list <<<"$specs"
towers_of() { if [[ $1 =~ _towers([0-9]+) ]]; then echo "${BASH_REMATCH[1]}"; else echo 1; fi; }
ours_keys=()  # <GPUs>gpu_<run> for every worker count and run of ours
for w in "${worker_counts[@]}"; do
  for o in "${ours_list[@]}"; do ours_keys+=("$((w * $(towers_of "$o")))gpu_$o"); done
done
for spec in "${spec_list[@]}"; do
  read -r name batch num_ps target max_epochs <<<"$spec"
  if [[ -z $name || ! $batch =~ ^[0-9]+$ || ! $num_ps =~ ^[0-9]+$ || -z $target ||
    ! $max_epochs =~ ^[0-9]+$ ]]; then
    say "==> bad spec '$spec' (want '<model> <batch> <ps tasks> <target> <max epochs>')"
    status=1
    continue
  fi
  config=$bundle/configs/$name.pbtxt
  [[ -f $config ]] || { say "==> $name: no $config"; status=1; continue; }
  say "==> $name, batch $batch, target test accuracy $target, at most $max_epochs epochs"
  declare -A times=()
  for ((r = 1; r <= repeats; r++)); do
    cl_model=$config
    seed_flags=()
    if [[ ${#seed_list[@]} -gt 0 ]]; then
      seed=${seed_list[r - 1]}
      cl_model=$work/${name}_seed$seed.pbtxt
      grep -q '^seed: ' "$config" ||
        { say "==> $name: $config has no top-level seed to change"; status=1; break; }
      sed "s/^seed: .*/seed: $seed/" "$config" >"$cl_model"
      seed_flags=(--seed="$seed")
      say "    repeat $r: seed $seed"
    fi
    # Ours: the evaluator reads the model each time the global step (one worker: its steps) has
    # moved half an epoch.
    for key in "${ours_keys[@]}"; do
      o=${key#*gpu_}
      towers=$(towers_of "$o")
      workers=$((${key%%gpu_*} / towers))
      device=${DEVICE:-gpu:0}
      [[ $workers -gt 1 ]] && device=${DEVICE:-gpu:\{i\}}
      if [[ $towers -gt 1 ]]; then
        device=gpu:0
        for ((g = 1; g < towers; g++)); do device+=",gpu:$g"; done
      fi
      worker_batch=$((batch * towers))  # <batch> per GPU, as DDP's
      run=${name}_ours_${key}_$r
      cl_evaluator_flags=(--eval_every_steps=$(((30000 + worker_batch - 1) / worker_batch)))
      # Steps reported every 10 ms (not every 2 s), so that the evaluator sees them in time
      # (at 1.4 M ex/s, 50 ms was 540 steps of 128, more than half an epoch).
      cl_ours_flags "$o" "$bundle/certs"
      cl_worker_flags+=(--report_every_secs=0.01)
      [[ ${#seed_flags[@]} -gt 0 ]] && cl_chief_flags+=(--shuffle_seed="$seed")
      cl_target_accuracy=$target
      seconds=inf
      if cl_train_to_end "$run" "$cl_mode" "$num_ps" "$workers" "$worker_batch" "$max_epochs" "$device" \
        "$run_timeout" 1 >"$work/$run.out" 2>&1 || [[ -s $cl_dir/chief-0.log ]]; then
        if read -r t step acc n < <(cl_time_to_accuracy "$target"); then
          seconds=$t
          say "    $run: $t s to test accuracy $acc (step $step, evaluation $n;" \
            "$(awk -v s="$step" -v b="$worker_batch" -v t="$t" \
              'BEGIN { printf "%.0f", (t > 0 ? s * b / t : 0) }') examples/s)"
        else
          say "    $run: not reached in $max_epochs epochs; $(cat "$cl_dir/final")"
        fi
      else
        say "    $run: FAILED; see $cl_dir"
        status=1
      fi
      times[ours_$key]="${times[ours_$key]:-} $seconds"
      unset cl_target_accuracy cl_evaluator_flags cl_worker_flags cl_chief_flags cl_tls_dir cl_mode
    done
    for mode in "${mode_list[@]}"; do
      run=${name}_${mode}_$r
      rc=0
      launch=("$python")
      capture=$mode
      if [[ $mode =~ ^ddp([0-9]+)_(.*)$ ]]; then
        launch=("$python" -m torch.distributed.run --standalone
          --nproc_per_node="${BASH_REMATCH[1]}")
        capture=${BASH_REMATCH[2]}
      fi
      ddp=()
      [[ $mode == ddp* ]] && ddp=(--ddp)
      timeout -k 10 "$run_timeout" "${launch[@]}" "$bundle/bench/torch_cnn.py" "${ddp[@]}" \
        ${seed_flags[@]+"${seed_flags[@]}"} \
        --model="$cl_model" --data="$bundle/data" --batch_size="$batch" --capture="$capture" \
        --target_accuracy="$target" --eval_every_examples=30000 --max_epochs="$max_epochs" \
        >"$work/$run.out" 2>"$work/$run.err" || rc=$?
      line=$(grep '^TORCH_CNN_TTA ' "$work/$run.out" | tail -1 || true)
      if [[ -z $line ]]; then
        say "    $run: FAILED (exit $rc); $(tail -1 "$work/$run.err" 2>/dev/null | cut -c1-300)"
        status=1
        continue
      fi
      t=$(grep -o '\bseconds=[^ ]*' <<<"$line" | head -1 | cut -d= -f2)
      say "    $run: $t s ($(grep -o '\b\(examples\|epochs\|test_accuracy\|reached\)=[^ ]*' \
        <<<"$line" | tr '\n' ' ' | sed 's/ $//'))"
      times[$mode]="${times[$mode]:-} $t"
    done
  done
  args=()
  for mode in "${ours_keys[@]/#/ours_}" "${mode_list[@]}"; do args+=("$mode" "${times[$mode]:-}"); done
  python3 - "$name" "$batch" "${args[@]}" <<'PY' | tee -a "$report"
import math, statistics, sys
name, batch, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
med = {}
for mode, runs in zip(rest[::2], rest[1::2]):
    vals = [float(v) for v in runs.split()]
    if vals:
        med[mode] = statistics.median(vals)
        print("    %s %s: median %s s of %s" % (name, mode, med[mode], " ".join(runs.split())))
torch = {m: v for m, v in med.items() if not m.startswith("ours_")}
for m, v in torch.items():
    print("BENCH torch_tta_%s_b%s_%s %.2f s" % (name, batch, m, v))
# ratio: the best PyTorch time over ours (> 1: we reach the target sooner); n/a without a
# PyTorch run that finished, inf when only ours reached it, 0 when only PyTorch did.
for run in [m for m in rest[::2] if m.startswith("ours_")]:
    ours = med.get(run, math.inf)
    if not torch:
        ratio = "n/a"
    else:
        best = min(torch.values())
        ratio = ("%.2f" % (best / ours) if math.isfinite(ours)
                 else "0" if math.isfinite(best) else "n/a")
    gpus, _, which = run[len("ours_"):].partition("gpu_")
    print("BENCH gpu_tta_%s_%sgpu_ours_%s %.2f s ratio=%s" % (name, gpus, which, ours, ratio))
PY
  unset times
done
exit $status
