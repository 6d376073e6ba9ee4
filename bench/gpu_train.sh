#!/usr/bin/env bash
# Training throughput on the GPU machine, against PyTorch on the same GPUs, in one call.
# Runs from the device bundle that bench/gpu_prepare.sh packs here (.devbundle: payload.tar.gz
# with the binaries, their libraries and the device-bundle `run` wrapper, unpacked into /tmp
# at the start; data/ with the Fashion-MNIST .gz files; configs/; bench/); nothing is built
# there and nothing is written into the bundle.
#
# First the CUDA tests in the bundle (cuda_kernels_test, cuda_trainer_test: the kernels, the
# pipelined trainer against in-process ps stores, and with 2+ GPUs the towers), then for each
# batch size B (128 and 1024 by default), the MLP of configs/mlp.pbtxt (784-256-256-10, Adam
# 1e-3 on the ps tasks) on Fashion-MNIST:
#   1. bench/torch_mlp.py: the same MLP in eager PyTorch on one GPU, the data on the GPU -- the
#      baseline of every one-GPU ratio (skipped, saying so, when `import torch` fails);
#   2. train_bench --loop=sequential (pull, compute, push one after another against in-process
#      stores: the push_ms figure) and --loop=pipelined (the worker's own loop, no RPC);
#   3. local clusters of 1 chief + P ps + 1 worker --device=gpu:0, async, for each P of
#      --ps_counts (1 2 4), steady-state examples/s (bench/train_rate.py).
# With G >= 2 GPUs visible (--gpus, default: all of them), for each B (per GPU):
#   4. PyTorch DistributedDataParallel (bench/torch_ddp_mlp.py under torchrun, NCCL, one process
#      per GPU) on 1, 2 and G GPUs;
#   5. clusters of W single-GPU workers (worker i on gpu:i) and G ps tasks, W = 2 and G;
#   6. a cluster of one worker with G towers (--device=gpu:0,...), batch G*B, and G ps tasks.
# Prints a table and BENCH lines, each with ratio= against PyTorch of the same call:
#   BENCH gpu_mlp_b<B>_<run> <ex/s> ex/s ratio=<vs PyTorch one GPU, batch B>
#   BENCH gpu_<G>gpu_b<B>_<run> <ex/s> ex/s ratio=<vs DDP on the same number of GPUs>
#   BENCH gpu_<G>gpu_b<B>_<run>_vs_torch1 <x> x ratio=<vs PyTorch one GPU>
# (ratio=n/a where PyTorch did not run). NVLink multicast stays off (NCCL_NVLS_ENABLE=0). With
# $OUT set (the device tool), the report and the logs are also written there.
#
#   bash .devbundle/bench/gpu_train.sh [--batches "128 1024"] [--ps_counts "1 2 4"]
#       [--gpus G] [--seconds S] [--warmup S] [--no_tests] [--no_single] [--no_train_bench]
#       [--multi "ddp 2w gw towers"] [--ps_flags "FLAGS"]
# --no_single skips 1-3 (PyTorch on one GPU included); --no_train_bench skips 2; --multi names
# the multi-GPU runs to do (4: ddp, 5: 2w and gw, 6: towers); --ps_flags are added to every ps
# task's flags (e.g. --apply_threads=1 where many ps tasks share the host).
# Environment: PYTHON (default python3, the one with PyTorch). DEVICE=cpu tries the logic on a
# machine without a GPU (PyTorch then runs on the CPU too, if it is there; no multi-GPU part).
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

device=${DEVICE:-gpu:0}
batches="128 1024"
ps_counts="1 2 4"
seconds=10
warmup=4
gpus=""
python=${PYTHON:-python3}
run_tests=1
run_single=1
run_train_bench=1
multi="ddp 2w gw towers"
ps_flags=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --batches) batches=$2; shift 2 ;;
    --ps_counts) ps_counts=$2; shift 2 ;;
    --gpus) gpus=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --no_tests) run_tests=0; shift ;;
    --no_single) run_single=0; shift ;;
    --no_train_bench) run_train_bench=0; shift ;;
    --multi) multi=$2; shift 2 ;;
    --ps_flags) ps_flags=$2; shift 2 ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "gpu_train.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for run in $multi; do
  case "$run" in
    ddp|2w|gw|towers) ;;
    *) echo "gpu_train.sh: --multi takes ddp, 2w, gw and towers, not \"$run\"" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_train.XXXXXX")
report="$work/gpu_train.txt"
runner=$bundle/run
if [[ ! -x $runner && -f $bundle/payload.tar.gz ]]; then
  mkdir -p "$work/payload"
  tar -C "$work/payload" -xzf "$bundle/payload.tar.gz"
  runner=$work/payload/run
fi
for f in "$runner" configs/mlp.pbtxt bench/train_rate.py bench/train_cluster.sh \
  bench/torch_mlp.py data/train-images-idx3-ubyte.gz data/train-labels-idx1-ubyte.gz; do
  [[ $f == /* ]] || f=$bundle/$f
  [[ -e $f ]] || { echo "gpu_train.sh: $f is missing; run bench/gpu_prepare.sh" >&2; exit 1; }
done
bin_dir=$(dirname "$runner")/bin
launch() { exec "$runner" "$@"; }
rate_py="$bundle/bench/train_rate.py"
cl_model="$bundle/configs/mlp.pbtxt"
cl_data_path="$bundle/data"
# shellcheck source=bench/train_cluster.sh
source "$bundle/bench/train_cluster.sh"
cl_ps_flags=()
[[ -n $ps_flags ]] && read -r -a cl_ps_flags <<<"$ps_flags"

status=0
finish() {
  local rc=$?
  if [[ ${#cl_pids[@]} -gt 0 ]]; then cl_stop || true; fi
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
    cp "$report" "$OUT/" 2>/dev/null || true
    tar -C "$work" -czf "$OUT/gpu_train_logs.tar.gz" --exclude=./payload . 2>/dev/null || true
  fi
  echo "==> logs in $work"
  exit $((rc != 0 ? rc : status))
}
trap finish EXIT
trap 'echo; echo "gpu_train.sh: interrupted"; exit 130' INT TERM

say() { echo "$@" | tee -a "$report"; }
visible=0
if [[ $device == gpu:* ]] && command -v nvidia-smi >/dev/null; then
  visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
[[ -z $gpus ]] && gpus=$visible
say "==> machine: $(nproc) cores, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
if [[ $visible -gt 0 ]]; then
  say "==> $visible GPU(s): $(nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv,noheader 2>&1 | head -1)"
fi
[[ -n $ps_flags ]] && say "==> every ps task also gets: $ps_flags"
say "==> batches: $batches; ${warmup} s warm-up, ${seconds} s timed per run; multi-GPU part on" \
  "$gpus GPU(s)"

if [[ $run_tests -eq 1 && $device == gpu:* ]]; then
  for t in cuda_kernels_test cuda_trainer_test; do
    [[ -x $bin_dir/$t ]] || continue
    echo "==> $t"
    if "$runner" "$t" >"$work/$t.log" 2>&1; then
      say "    $t: $(grep -E '^\[  PASSED  \]' "$work/$t.log" || echo passed);" \
        "$(grep -c '^\[  SKIPPED \]' "$work/$t.log" || true) skipped"
    else
      say "    $t FAILED (see $work/$t.log)"
      grep -E 'Failure|FAILED|Check failed' -A3 "$work/$t.log" | head -30 | tee -a "$report"
      status=1
    fi
  done
fi

torch_device=cpu
[[ $device == gpu:* ]] && torch_device=cuda:${device#gpu:}
torch_ok=0
if $python -c "import torch, numpy; assert '$torch_device' == 'cpu' or torch.cuda.is_available()" \
  2>/dev/null; then
  torch_ok=1
  say "==> PyTorch $($python -c 'import torch; print(torch.__version__)') on $torch_device"
else
  say "==> PyTorch is not available here: the PyTorch baselines are skipped and ratios are n/a"
fi

declare -A eps ms cpu_split note
# run_cluster KEY NUM_PS NUM_WORKERS BATCH DEVICE: one async cluster, its figures under KEY.
run_cluster() {
  local key=$1 num_ps=$2 num_workers=$3 batch=$4 dev=$5 f
  echo "==> $key: 1 chief + $num_ps ps + $num_workers worker(s) --device=$dev, batch $batch"
  # A run that fails is reported and the others go on.
  if ! cl_start "$key" async "$num_ps" "$num_workers" "$batch" 100000 "$dev" ||
    ! cl_measure "$warmup" "$seconds" "$batch" async; then
    say "    $key FAILED (see $cl_dir)"
    tail -5 "$cl_dir"/worker-0.log 2>/dev/null || true
    status=1
    cl_stop || true
    return 0
  fi
  f=$cl_dir/rate
  eps[$key]=$(kv examples_per_second "$f")
  ms[$key]=$(kv step_ms "$f")
  cpu_split[$key]="$(kv cpu_ms_per_step_worker "$f") / $(kv cpu_ms_per_step_ps "$f")"
  note[$key]="status check $(kv status_examples_per_second "$f") ex/s"
  cl_stop || status=1
}

for b in $batches; do
  if [[ $run_single -eq 1 ]]; then
    if [[ $torch_ok -eq 1 ]]; then
      echo "==> batch $b: PyTorch (bench/torch_mlp.py)"
      $python "$bundle/bench/torch_mlp.py" --data="$bundle/data" --device="$torch_device" \
        --batch_size="$b" --warmup_seconds="$warmup" --seconds="$seconds" | tee "$work/torch_b$b"
      eps[torch_b$b]=$(kv examples_per_second "$work/torch_b$b")
      ms[torch_b$b]=$(kv step_ms "$work/torch_b$b")
    fi
    for loop in sequential pipelined; do
      [[ $run_train_bench -eq 1 ]] || break
      key=bench_${loop}_b$b
      echo "==> batch $b: train_bench --loop=$loop --device=$device (in-process stores, no RPC)"
      "$runner" train_bench --loop="$loop" --device="$device" --batch_size="$b" --num_ps=2 \
        --data_path="$bundle/data" --model_config="$bundle/configs/mlp.pbtxt" \
        --warmup_seconds="$warmup" --seconds="$seconds" 2>"$work/$key.log" | tee "$work/$key"
      eps[$key]=$(kv examples_per_second "$work/$key")
      ms[$key]=$(kv step_ms "$work/$key")
      cpu_split[$key]="$(kv cpu_ms "$work/$key") (all)"
      if [[ $loop == sequential ]]; then
        note[$key]="pull / compute / push ms: $(kv pull_ms "$work/$key") / $(kv compute_ms "$work/$key") / $(kv push_ms "$work/$key")"
        eps[push_ms_b$b]=$(kv push_ms "$work/$key")
      else
        note[$key]="staleness max $(kv max_staleness "$work/$key")"
      fi
    done
    for p in $ps_counts; do run_cluster "b${b}_1w${p}ps" "$p" 1 "$b" "$device"; done
  fi

  if [[ $gpus -ge 2 ]]; then
    for g in 1 2 $gpus; do
      [[ " $multi " == *" ddp "* ]] || break
      [[ $g -eq 2 && $gpus -eq 2 && -n ${eps[ddp${g}_b$b]:-} ]] && continue
      if [[ $torch_ok -eq 1 ]]; then
        echo "==> batch $b per GPU: PyTorch DDP on $g GPU(s)"
        CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((g - 1))) $python -m torch.distributed.run \
          --standalone --nproc_per_node="$g" "$bundle/bench/torch_ddp_mlp.py" \
          --data="$bundle/data" --batch_size="$b" --warmup_seconds="$warmup" \
          --seconds="$seconds" 2>"$work/ddp${g}_b$b.log" | tee "$work/ddp${g}_b$b" ||
          { say "    DDP on $g GPUs FAILED"; tail -5 "$work/ddp${g}_b$b.log"; status=1; }
        eps[ddp${g}_b$b]=$(kv examples_per_second "$work/ddp${g}_b$b")
        ms[ddp${g}_b$b]=$(kv step_ms "$work/ddp${g}_b$b")
      fi
    done
    for w in 2 "$gpus"; do
      [[ $w -eq 2 && " $multi " != *" 2w "* ]] && continue
      [[ $w -eq $gpus && $w -ne 2 && " $multi " != *" gw "* ]] && continue
      [[ $w -eq 2 && $gpus -eq 2 && -n ${eps[b${b}_${w}w${gpus}ps]:-} ]] && continue
      run_cluster "b${b}_${w}w${gpus}ps" "$gpus" "$w" "$b" "gpu:{i}"
    done
    if [[ " $multi " == *" towers "* ]]; then
      towers=$(seq -s, 0 $((gpus - 1)) | sed 's/\([0-9]\+\)/gpu:\1/g')
      run_cluster "b${b}_1w${gpus}towers" "$gpus" 1 $((gpus * b)) "$towers"
    fi
  fi
done

ratio() { [[ -n ${1:-} && -n ${2:-} ]] && python3 -c "print('%.2f' % ($1 / $2))" || echo n/a; }
{
  echo
  echo "Training throughput: MLP 784-256-256-10 (Adam), Fashion-MNIST"
  echo
  echo "| batch | run | examples/s | vs PyTorch (1 GPU) | vs DDP (same GPUs) | step (ms) | CPU ms per step (worker / ps) | notes |"
  echo "|---:|---|---:|---:|---:|---:|---:|---|"
  for b in $batches; do
    t=${eps[torch_b$b]:-}
    row() {  # key label ddp_key
      local key=$1 label=$2 ddp=${3:-} base=""
      [[ -n ${eps[$key]:-} ]] || return 0
      [[ -n $ddp ]] && base=${eps[$ddp]:-}
      echo "| $b | $label | ${eps[$key]} | $(ratio "${eps[$key]}" "$t") | $(ratio "${eps[$key]}" "$base") | ${ms[$key]:-} | ${cpu_split[$key]:--} | ${note[$key]:-} |"
    }
    row "torch_b$b" "PyTorch eager, one GPU"
    row "bench_sequential_b$b" "train_bench, sequential, no RPC"
    row "bench_pipelined_b$b" "train_bench, pipelined loop, no RPC"
    for p in $ps_counts; do row "b${b}_1w${p}ps" "1 GPU worker + $p ps, async"; done
    if [[ $gpus -ge 2 ]]; then
      for g in 1 2 $gpus; do row "ddp${g}_b$b" "PyTorch DDP, $g GPU(s), $b per GPU" "ddp${g}_b$b"; done
      for w in 2 "$gpus"; do
        row "b${b}_${w}w${gpus}ps" "$w single-GPU workers + $gpus ps" "ddp${w}_b$b"
      done
      row "b${b}_1w${gpus}towers" "1 worker, $gpus towers ($((gpus * b)) a step) + $gpus ps" "ddp${gpus}_b$b"
    fi
  done
  echo
  for b in $batches; do
    t=${eps[torch_b$b]:-}
    pre=gpu_mlp_b$b
    [[ -n $t ]] && echo "BENCH ${pre}_torch $t ex/s ratio=1.00"
    for k in bench_sequential bench_pipelined; do
      [[ -n ${eps[${k}_b$b]:-} ]] && echo "BENCH ${pre}_${k#bench_}_norpc ${eps[${k}_b$b]} ex/s ratio=$(ratio "${eps[${k}_b$b]}" "$t")"
    done
    [[ -n ${eps[push_ms_b$b]:-} ]] && echo "BENCH ${pre}_push_ms ${eps[push_ms_b$b]} ms ratio=n/a"
    for p in $ps_counts; do
      k=b${b}_1w${p}ps
      [[ -n ${eps[$k]:-} ]] && echo "BENCH ${pre}_1w${p}ps ${eps[$k]} ex/s ratio=$(ratio "${eps[$k]}" "$t")"
    done
    if [[ $gpus -ge 2 ]]; then
      pre=gpu_${gpus}gpu_b$b
      for g in 1 2 $gpus; do
        k=ddp${g}_b$b
        [[ -n ${eps[$k]:-} ]] && echo "BENCH ${pre}_ddp${g} ${eps[$k]} ex/s ratio=1.00"
      done
      for w in 2 "$gpus"; do
        k=b${b}_${w}w${gpus}ps
        [[ -n ${eps[$k]:-} ]] || continue
        echo "BENCH ${pre}_${w}w${gpus}ps ${eps[$k]} ex/s ratio=$(ratio "${eps[$k]}" "${eps[ddp${w}_b$b]:-}")"
        echo "BENCH ${pre}_${w}w${gpus}ps_vs_torch1 $(ratio "${eps[$k]}" "$t") x ratio=$(ratio "${eps[$k]}" "$t")"
      done
      k=b${b}_1w${gpus}towers
      if [[ -n ${eps[$k]:-} ]]; then
        echo "BENCH ${pre}_1w${gpus}towers ${eps[$k]} ex/s ratio=$(ratio "${eps[$k]}" "${eps[ddp${gpus}_b$b]:-}")"
        echo "BENCH ${pre}_1w${gpus}towers_vs_torch1 $(ratio "${eps[$k]}" "$t") x ratio=$(ratio "${eps[$k]}" "$t")"
      fi
    fi
  done
} | tee -a "$report"
