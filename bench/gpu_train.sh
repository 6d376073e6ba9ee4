#!/usr/bin/env bash
# Training throughput on the GPU machine, against PyTorch on the same GPU, in one call.
# Runs from the device bundle that bench/gpu_prepare.sh packs here (.devbundle: payload.tar.gz
# with the binaries, their libraries and the device-bundle `run` wrapper, unpacked into /tmp
# at the start; data/ with the Fashion-MNIST .gz files; configs/; bench/); nothing is built
# there and nothing is written into the bundle.
# For each batch size (128 and 1024 by default):
#   1. bench/torch_mlp.py: the same MLP (784-256-256-10, Adam 1e-3) in eager PyTorch, the data
#      on the GPU -- the baseline (skipped, saying so, when `import torch` fails);
#   2. train_bench --device=$DEVICE: a worker's step (pull, compute on the CUDA kernels, push)
#      against in-process parameter stores, no RPC;
#   3. a local cluster of 1 chief + 2 ps + 1 worker --device=$DEVICE, async, steady-state
#      examples/s (bench/train_rate.py; the same measurement as bench/train.sh).
# Before that, the CUDA kernels' own test (cuda_kernels_test) runs when it is in the bundle.
# Prints a table and BENCH lines with ratios against PyTorch of the same batch:
#   BENCH gpu_torch_b<B> <ex/s> ex/s ratio=1.00
#   BENCH gpu_train_bench_b<B> <ex/s> ex/s ratio=<vs PyTorch>
#   BENCH gpu_1w2ps_b<B> <ex/s> ex/s ratio=<vs PyTorch>
# (ratio=n/a where PyTorch did not run). With $OUT set (the device tool), the report and the
# logs are also written there (gpu_train.txt, gpu_train_logs.tar.gz).
#
#   bash .devbundle/bench/gpu_train.sh [--device gpu:0] [--batches "128 1024"] [--seconds S]
#                                      [--warmup S] [--no_kernel_test]
# Environment: DEVICE (default gpu:0) and BATCHES, SECONDS_MEASURE, WARMUP as the flags, and
# PYTHON (default python3, the one with PyTorch). Run with DEVICE=cpu to try the logic on a
# machine without a GPU (PyTorch then runs on the CPU too, if it is there).
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)

device=${DEVICE:-gpu:0}
batches=${BATCHES:-"128 1024"}
seconds=${SECONDS_MEASURE:-15}
warmup=${WARMUP:-5}
python=${PYTHON:-python3}
kernel_test=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --no_kernel_test) kernel_test=0; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu_train.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d /tmp/gpu_train.XXXXXX)
report="$work/gpu_train.txt"
# The binaries: the bundle's run, bin/ and lib/, or its payload.tar.gz unpacked here.
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
say "==> machine: $(nproc) cores, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
if command -v nvidia-smi >/dev/null; then
  say "==> $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    2>&1 | head -1)"
fi
say "==> device $device; batches: $batches; ${warmup} s warm-up, ${seconds} s timed per run"

if [[ $kernel_test -eq 1 && -x $bin_dir/cuda_kernels_test && $device == gpu:* ]]; then
  echo "==> cuda_kernels_test"
  if "$runner" cuda_kernels_test >"$work/cuda_kernels_test.log" 2>&1; then
    say "    cuda_kernels_test: $(grep -E '^\[  PASSED  \]' "$work/cuda_kernels_test.log" ||
      echo passed)"
  else
    say "    cuda_kernels_test FAILED (see $work/cuda_kernels_test.log); figures below are suspect"
    tail -20 "$work/cuda_kernels_test.log"
    status=1
  fi
fi

# PyTorch on the same device: gpu:N -> cuda:N (cpu -> cpu, to try the script).
torch_device=cpu
[[ $device == gpu:* ]] && torch_device=cuda:${device#gpu:}
torch_ok=0
if $python -c "import torch, numpy; assert '$torch_device' == 'cpu' or torch.cuda.is_available()" \
  2>/dev/null; then
  torch_ok=1
  say "==> PyTorch $($python -c 'import torch; print(torch.__version__)') on $torch_device"
else
  say "==> PyTorch is not available here ($python -c 'import torch, numpy' failed, or it sees" \
    "no GPU): the PyTorch baseline is skipped and ratios are n/a"
fi

declare -A torch_eps torch_ms bench_eps bench_ms bench_split bench_cpu cluster_eps cluster_ms \
  cluster_check cluster_cpu
for b in $batches; do
  if [[ $torch_ok -eq 1 ]]; then
    echo "==> batch $b: PyTorch (bench/torch_mlp.py)"
    $python "$bundle/bench/torch_mlp.py" --data="$bundle/data" --device="$torch_device" \
      --batch_size="$b" --warmup_seconds="$warmup" --seconds="$seconds" | tee "$work/torch_b$b"
    torch_eps[$b]=$(kv examples_per_second "$work/torch_b$b")
    torch_ms[$b]=$(kv step_ms "$work/torch_b$b")
  fi

  echo "==> batch $b: train_bench --device=$device (one process, in-process parameter stores)"
  "$runner" train_bench --device="$device" --batch_size="$b" --data_path="$bundle/data" \
    --model_config="$bundle/configs/mlp.pbtxt" --warmup_seconds="$warmup" \
    --seconds="$seconds" 2>"$work/train_bench_b$b.log" | tee "$work/train_bench_b$b"
  bench_eps[$b]=$(kv examples_per_second "$work/train_bench_b$b")
  bench_ms[$b]=$(kv step_ms "$work/train_bench_b$b")
  f=$work/train_bench_b$b
  bench_split[$b]="$(kv pull_ms "$f") / $(kv compute_ms "$f") / $(kv push_ms "$f")"
  bench_cpu[$b]="$(kv cpu_ms "$work/train_bench_b$b") (all)"

  echo "==> batch $b: 1 chief + 2 ps + 1 worker --device=$device, async"
  # Epochs enough for any rate: the cluster is stopped once measured.
  cl_start "b$b" async 2 1 "$b" 100000 "$device"
  cl_measure "$warmup" "$seconds" "$b" async
  cluster_eps[$b]=$(kv examples_per_second "$cl_dir/rate")
  cluster_ms[$b]=$(kv step_ms "$cl_dir/rate")
  cluster_check[$b]=$(kv status_examples_per_second "$cl_dir/rate")
  f=$cl_dir/rate
  cluster_cpu[$b]="$(kv cpu_ms_per_step_worker "$f") / $(kv cpu_ms_per_step_ps "$f")"
  cl_stop || status=1
done

ratio() { [[ -n ${2:-} ]] && python3 -c "print('%.2f' % ($1 / $2))" || echo n/a; }
ratio_x() { local r; r=$(ratio "$@"); [[ $r == n/a ]] && echo n/a || echo "${r}x"; }
prefix=${device%%:*}  # gpu (cpu when trying the script)
{
  echo
  echo "Training throughput on $device: MLP 784-256-256-10 (Adam), Fashion-MNIST"
  echo
  echo "| batch | run | examples/s | vs PyTorch | step time (ms) | CPU ms per step |"
  echo "|---:|---|---:|---:|---:|---:|"
  for b in $batches; do
    if [[ -n ${torch_eps[$b]:-} ]]; then
      echo "| $b | PyTorch, eager, one process | ${torch_eps[$b]} | 1.00x | ${torch_ms[$b]} | - |"
    else
      echo "| $b | PyTorch | not run | - | - | - |"
    fi
    echo "| $b | train_bench, no RPC (pull / compute / push ms: ${bench_split[$b]}) | ${bench_eps[$b]} | $(ratio_x "${bench_eps[$b]}" "${torch_eps[$b]:-}") | ${bench_ms[$b]} | ${bench_cpu[$b]} |"
    echo "| $b | 1 worker + 2 ps, async (global_step check: ${cluster_check[$b]} ex/s) | ${cluster_eps[$b]} | $(ratio_x "${cluster_eps[$b]}" "${torch_eps[$b]:-}") | ${cluster_ms[$b]} | ${cluster_cpu[$b]} (worker / ps) |"
  done
  echo
  for b in $batches; do
    if [[ -n ${torch_eps[$b]:-} ]]; then
      echo "BENCH ${prefix}_torch_b$b ${torch_eps[$b]} ex/s ratio=1.00"
    fi
    echo "BENCH ${prefix}_train_bench_b$b ${bench_eps[$b]} ex/s ratio=$(ratio "${bench_eps[$b]}" "${torch_eps[$b]:-}")"
    echo "BENCH ${prefix}_1w2ps_b$b ${cluster_eps[$b]} ex/s ratio=$(ratio "${cluster_eps[$b]}" "${torch_eps[$b]:-}")"
  done
} | tee -a "$report"
