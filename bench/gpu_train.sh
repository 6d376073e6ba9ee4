#!/usr/bin/env bash
# Training throughput on the GPU machine, against PyTorch on the same GPUs, in one call.
# Runs from the device bundle that bench/gpu_prepare.sh packs here (.devbundle: payload.tar.gz
# with the binaries, their libraries and the device-bundle `run` wrapper, unpacked into /tmp
# at the start; data/ with the Fashion-MNIST .gz files; configs/; bench/); nothing is built
# there and nothing is written into the bundle.
#
# First the CUDA tests in the bundle (cuda_kernels_test, cuda_trainer_test: the kernels, the
# pipelined trainer against in-process ps stores, and with 2+ GPUs the towers); with
# --epochs_accuracy N (0, the default: skipped), the accuracy of the model after N epochs at
# batch --accuracy_batch (128): a local cluster of 1 chief, 2 ps, 1 worker --device=gpu:0 and an
# evaluator, trained to the end (bench/train_cluster.sh's cl_train_to_end; at most
# --accuracy_timeout s, default 300), then bench/torch_cnn.py --epochs N --eval (the same network,
# optimizer and learning-rate decay in PyTorch on the same GPU, the test accuracy per epoch).
# Then for each batch size B (128 and 1024 by default), the model of --model (default
# configs/mlp.pbtxt: the MLP 784-256-256-10, Adam 1e-3 on the ps tasks) on Fashion-MNIST:
#   1. the same model in eager PyTorch on one GPU, the data on the GPU -- the baseline of every
#      one-GPU ratio (skipped, saying so, when `import torch` fails): bench/torch_mlp.py for
#      the MLP, bench/torch_cnn.py (the network built from the config file) for any other model;
#   2. train_bench --loop=sequential (pull, compute, push one after another against in-process
#      stores: the push_ms figure) and --loop=pipelined (the worker's own loop, no RPC);
#   3. local clusters of 1 chief + P ps + 1 worker --device=gpu:0, async, for each P of
#      --ps_counts (1 2 4), steady-state examples/s (bench/train_rate.py).
# With G >= 2 GPUs visible (--gpus, default: all of them), for each B (per GPU):
#   4. PyTorch DistributedDataParallel (bench/torch_ddp_mlp.py, or bench/torch_cnn.py --ddp for
#      a model other than the MLP, under torchrun, NCCL, one process per GPU) on 1, 2 and G GPUs;
#   5. clusters of W single-GPU workers (worker i on gpu:i) and G ps tasks, W = 2 and G;
#   6. a cluster of one worker with G towers (--device=gpu:0,...), batch G*B, and G ps tasks.
# Prints a table and BENCH lines, each with ratio= against PyTorch of the same call:
#   BENCH gpu_mlp_b<B>_<run> <ex/s> ex/s ratio=<vs PyTorch one GPU, batch B>
#   BENCH gpu_<G>gpu_b<B>_<run> <ex/s> ex/s ratio=<vs DDP on the same number of GPUs>
#   BENCH gpu_<G>gpu_b<B>_<run>_vs_torch1 <x> x ratio=<vs PyTorch one GPU>
# for the MLP; for another model (<M>: the config's name, e.g. resnet20)
#   BENCH gpu_cnn_<M>_b<B>_<run> ...  and  BENCH gpu_cnn_<M>_<G>gpu_b<B>_<run> ...
# and with --epochs_accuracy N (B: --accuracy_batch)
#   BENCH gpu_cnn_<M>_b<B>_accuracy_e<N>_torch <test accuracy> acc ratio=1.00
#   BENCH gpu_cnn_<M>_b<B>_accuracy_e<N>_1w2ps <test accuracy> acc ratio=<vs PyTorch's>
# (gpu_mlp_b<B>_accuracy_... for the MLP; ratio=n/a where PyTorch did not run). NVLink
# multicast stays off (NCCL_NVLS_ENABLE=0). With $OUT set (the device tool), the report and the
# logs are also written there.
#
#   bash .devbundle/bench/gpu_train.sh [--model configs/mlp.pbtxt] [--batches "128 1024"]
#       [--ps_counts "1 2 4"] [--gpus G] [--seconds S] [--warmup S] [--no_tests] [--no_single]
#       [--no_train_bench] [--multi "ddp 2w gw towers"] [--ps_flags "FLAGS"]
#       [--epochs_accuracy N] [--accuracy_batch B] [--accuracy_timeout S]
# --model: a model config, relative to the bundle (or the current folder), e.g.
# configs/resnet20.pbtxt or configs/cnn.pbtxt; it goes to train_bench, every cluster and
# PyTorch.
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
model=configs/mlp.pbtxt
epochs_accuracy=0
accuracy_batch=128
accuracy_timeout=300
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
    --model) model=$2; shift 2 ;;
    --epochs_accuracy) epochs_accuracy=$2; shift 2 ;;
    --accuracy_batch) accuracy_batch=$2; shift 2 ;;
    --accuracy_timeout) accuracy_timeout=$2; shift 2 ;;
    -h|--help) sed -n "2,$(grep -n '^set -euo pipefail' "$0" | cut -d: -f1)p" "$0" | sed '$d'
      exit 0 ;;
    *) echo "gpu_train.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for run in $multi; do
  case "$run" in
    ddp|2w|gw|towers) ;;
    *) echo "gpu_train.sh: --multi takes ddp, 2w, gw and towers, not \"$run\"" >&2; exit 2 ;;
  esac
done

# The model: a path relative to the bundle, else to the current folder, or absolute.
if [[ $model != /* ]]; then
  if [[ -f $bundle/$model ]]; then model=$bundle/$model; else model=$(pwd)/$model; fi
fi
[[ -f $model ]] || { echo "gpu_train.sh: no model config $model" >&2; exit 2; }
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
# The MLP of configs/mlp.pbtxt keeps its own baselines and BENCH names; any other model is
# built from its config by bench/torch_cnn.py.
is_mlp=0
[[ $model -ef $bundle/configs/mlp.pbtxt ]] && is_mlp=1
for n in "$epochs_accuracy" "$accuracy_batch" "$accuracy_timeout"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "gpu_train.sh: not a number: $n" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_train.XXXXXX")
report="$work/gpu_train.txt"
runner=$bundle/run
if [[ ! -x $runner && -f $bundle/payload.tar.gz ]]; then
  mkdir -p "$work/payload"
  tar -C "$work/payload" -xzf "$bundle/payload.tar.gz"
  runner=$work/payload/run
fi
needed=("$runner" bench/train_rate.py bench/train_cluster.sh data/train-images-idx3-ubyte.gz
  data/train-labels-idx1-ubyte.gz)
[[ $is_mlp -eq 1 ]] && needed+=(bench/torch_mlp.py) || needed+=(bench/torch_cnn.py)
[[ $epochs_accuracy -gt 0 ]] && needed+=(bench/torch_cnn.py data/t10k-images-idx3-ubyte.gz
  data/t10k-labels-idx1-ubyte.gz)
for f in "${needed[@]}"; do
  [[ $f == /* ]] || f=$bundle/$f
  [[ -e $f ]] || { echo "gpu_train.sh: $f is missing; run bench/gpu_prepare.sh" >&2; exit 1; }
done
bin_dir=$(dirname "$runner")/bin
launch() { exec "$runner" "$@"; }
rate_py="$bundle/bench/train_rate.py"
cl_model="$model"
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
if [[ $is_mlp -eq 1 ]]; then
  model_name=mlp
  model_title="MLP 784-256-256-10 (Adam)"
  bench_pre=gpu_mlp
  torch1=("$bundle/bench/torch_mlp.py")
  torch_ddp=("$bundle/bench/torch_ddp_mlp.py")
else
  # The config's name and parameter count, from bench/torch_cnn.py's parser (no PyTorch
  # needed); a config it cannot build stops the script here.
  describe=$(python3 "$bundle/bench/torch_cnn.py" --describe --model="$model") ||
    { echo "gpu_train.sh: bench/torch_cnn.py cannot build $model" >&2; exit 2; }
  model_name=$(sed -n '1s/^model \([^:]*\):.*/\1/p' <<<"$describe" | tr -c 'A-Za-z0-9_\n' '_')
  model_title="$model_name ($(basename "$model"), $(grep -o '^params=[0-9]*' <<<"$describe" |
    cut -d= -f2) parameters, $(sed -n '1s/^model [^:]*: //p' <<<"$describe"))"
  bench_pre=gpu_cnn_$model_name
  torch1=("$bundle/bench/torch_cnn.py" --model="$model")
  torch_ddp=("$bundle/bench/torch_cnn.py" --ddp --model="$model")
fi
say "==> model: $model_title ($model)"
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

declare -A eps ms cpu_split note acc acc_note

# The accuracy after --epochs_accuracy epochs: ours (1 chief, 2 ps, 1 worker, an evaluator,
# trained to the end), then PyTorch's.
if [[ $epochs_accuracy -gt 0 ]]; then
  ab=$accuracy_batch
  with_eval=1
  if [[ ! -x $bin_dir/evaluator ]]; then
    say "    (the bundle has no evaluator: the chief evaluates)"
    with_eval=0
  fi
  echo "==> accuracy: $model_name, $epochs_accuracy epochs at batch $ab: 1 chief + 2 ps + 1" \
    "worker --device=$device$([[ $with_eval -eq 1 ]] && echo " + evaluator"), async, to the" \
    "end (at most $accuracy_timeout s)"
  key=accuracy_e${epochs_accuracy}_b$ab
  if cl_train_to_end "$key" async 2 1 "$ab" "$epochs_accuracy" "$device" "$accuracy_timeout" \
    "$with_eval"; then
    acc[ours]=$(kv test_accuracy "$cl_dir/final" || true)
  else
    say "    $key did not finish (see $cl_dir): its last evaluation is" \
      "$(kv test_accuracy "$cl_dir/final" 2>/dev/null || true)"
    tail -3 "$cl_dir"/worker-0.log 2>/dev/null || true
    status=1
  fi
  acc_note[ours]="$(kv seconds "$cl_dir/final" || true) s, to step $(kv step "$cl_dir/final" ||
    true); finished=$(kv finished "$cl_dir/final" || true)"
  [[ -n ${acc[ours]:-} ]] ||
    acc_note[ours]+=", last evaluation $(kv test_accuracy "$cl_dir/final" 2>/dev/null || true)"
  # The worker's shard (all the training examples: one worker) from its log.
  shard=$(sed -nE 's/.*worker:0: ([0-9]+) of [0-9]+ training examples.*/\1/p' \
    "$cl_dir/worker-0.log" 2>/dev/null | head -1)
  steps_per_epoch=$(((${shard:-60000} + ab - 1) / ab))
  say "    ours, every evaluation (step, epoch, test accuracy):"
  awk -v s="$steps_per_epoch" '{printf "      step %6d  epoch %5.2f  accuracy %s  (by %s)\n", $1, $1 / s, $2, $4}' \
    "$cl_dir/evaluations" | tee -a "$report"
  say "    ours: test accuracy ${acc[ours]:-n/a} after $epochs_accuracy epochs (${acc_note[ours]})"
  if [[ $torch_ok -eq 1 ]]; then
    echo "==> accuracy: PyTorch (bench/torch_cnn.py --epochs $epochs_accuracy --eval), batch $ab"
    if $python "$bundle/bench/torch_cnn.py" --model="$model" --data="$bundle/data" \
      --device="$torch_device" --batch_size="$ab" --epochs="$epochs_accuracy" --eval \
      2>"$work/torch_$key.log" | tee "$work/torch_$key"; then
      acc[torch]=$(kv test_accuracy "$work/torch_$key" || true)
      acc_note[torch]="$(kv seconds "$work/torch_$key" || true) s"
      grep '^TORCH_CNN_EPOCH' "$work/torch_$key" >>"$report" || true
    else
      say "    PyTorch's accuracy run FAILED"; tail -5 "$work/torch_$key.log"; status=1
    fi
  fi
  say "    PyTorch: test accuracy ${acc[torch]:-n/a} after $epochs_accuracy epochs (${acc_note[torch]:-})"
fi
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
      echo "==> batch $b: PyTorch (bench/$(basename "${torch1[0]}"))"
      $python "${torch1[@]}" --data="$bundle/data" --device="$torch_device" \
        --batch_size="$b" --warmup_seconds="$warmup" --seconds="$seconds" | tee "$work/torch_b$b" ||
        { say "    PyTorch on one GPU FAILED"; status=1; }
      eps[torch_b$b]=$(kv examples_per_second "$work/torch_b$b" || true)
      ms[torch_b$b]=$(kv step_ms "$work/torch_b$b" || true)
    fi
    for loop in sequential pipelined; do
      [[ $run_train_bench -eq 1 ]] || break
      key=bench_${loop}_b$b
      echo "==> batch $b: train_bench --loop=$loop --device=$device (in-process stores, no RPC)"
      "$runner" train_bench --loop="$loop" --device="$device" --batch_size="$b" --num_ps=2 \
        --data_path="$bundle/data" --model_config="$model" \
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
          --standalone --nproc_per_node="$g" "${torch_ddp[@]}" \
          --data="$bundle/data" --batch_size="$b" --warmup_seconds="$warmup" \
          --seconds="$seconds" 2>"$work/ddp${g}_b$b.log" | tee "$work/ddp${g}_b$b" ||
          { say "    DDP on $g GPUs FAILED"; tail -5 "$work/ddp${g}_b$b.log"; status=1; }
        eps[ddp${g}_b$b]=$(kv examples_per_second "$work/ddp${g}_b$b" || true)
        ms[ddp${g}_b$b]=$(kv step_ms "$work/ddp${g}_b$b" || true)
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
  if [[ $epochs_accuracy -gt 0 ]]; then
    echo "Test accuracy after $epochs_accuracy epochs at batch $accuracy_batch: $model_title, Fashion-MNIST"
    echo
    echo "| run | test accuracy | vs PyTorch | notes |"
    echo "|---|---:|---:|---|"
    echo "| PyTorch eager, one GPU | ${acc[torch]:-n/a} | | ${acc_note[torch]:-} |"
    echo "| 1 GPU worker + 2 ps + evaluator, async | ${acc[ours]:-n/a} | $(ratio "${acc[ours]:-}" "${acc[torch]:-}") | ${acc_note[ours]:-} |"
    echo
  fi
  echo "Training throughput: $model_title, Fashion-MNIST"
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
    pre=${bench_pre}_b$b
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
      [[ $is_mlp -eq 1 ]] || pre=${bench_pre}_${gpus}gpu_b$b
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
  if [[ $epochs_accuracy -gt 0 ]]; then
    pre=${bench_pre}_b${accuracy_batch}_accuracy_e$epochs_accuracy
    if [[ -n ${acc[torch]:-} ]]; then echo "BENCH ${pre}_torch ${acc[torch]} acc ratio=1.00"; fi
    if [[ -n ${acc[ours]:-} && ${acc[ours]} != n/a ]]; then
      echo "BENCH ${pre}_1w2ps ${acc[ours]} acc ratio=$(ratio "${acc[ours]}" "${acc[torch]:-}")"
    fi
  fi
} | tee -a "$report"
