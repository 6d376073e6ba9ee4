#!/usr/bin/env bash
# Wide & deep (configs/wide_deep_ctr.pbtxt) on GPU workers against the same model in PyTorch on
# one GPU (bench/torch_ctr.py), in one call on the GPU machine, on the same data:
#   1. synthetic Criteo-layout click logs from a planted logistic model (ctr_datagen; it prints
#      the planted model's test AUC, the best a model can reach on them);
#   2. both files read by our Criteo reader and written as arrays (ctr_export), which the
#      PyTorch baseline trains on: the same dense values and sparse ids our workers see;
#   3. ours: a local cluster of 1 chief, --ps ps tasks and W workers (each --workers value),
#      worker i on GPU i (all on GPU 0 when the machine has one), async, --epochs to the end;
#      examples/s over the chief's training clock (from the first step) when the last worker
#      finished (not counting the final checkpoint and evaluation after it), and the final
#      model's test AUC; with --checkpoint_every_secs S it checkpoints every S s meanwhile;
#   4. PyTorch on GPU 0 (bench/torch_ctr.py), each of --torch_variants: "sparse" (sparse
#      gradients, the batch's rows updated, eager), "sparse_compile" (the same with the dense
#      tower compiled) and "dense_graph" (dense gradients, every row updated, the whole step
#      captured in one CUDA graph); the fastest is the baseline.
# Prints each run and
#   BENCH gpu_ctr_<W>w<P>ps <ex/s> ex/s ratio=<ours / the faster PyTorch run> (AUC ...)
#   BENCH gpu_ctr_torch_1gpu <ex/s> ex/s (AUC ...)
# From the device bundle (bench/gpu_prepare.sh), on the device machine:
#   bash .devbundle/bench/gpu_ctr.sh [--train_examples N] [--ids_per_field N] [--zipf X]
#        [--epochs E] [--batch B] [--ps P] [--workers "1 2"] [--checkpoint_every_secs S]
#        [--torch 0|1] [--torch_variants "sparse dense_graph"] [--data DIR]
#        [--ps_flags "--flag=value ..."]
# --data DIR: where the data goes; a DIR that already has it (an earlier run's) is used as it is,
# so that runs with and without checkpoints train on the same files.
# Defaults: 4,000,000 examples, 1,000,000 values per field (zipf 1.05), 2 epochs, batch 1024,
# 4 ps tasks, workers "1" (and "1 2" on a machine of 2 GPUs), no periodic checkpoints. With
# $OUT set the report is also written there.
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)
train_examples=4000000
ids_per_field=1000000
zipf=1.05
epochs=2
batch=1024
num_ps=4
workers=""
every=0
torch=1
torch_variants="sparse dense_graph"
data=""
cl_ps_flags=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --train_examples) train_examples=$2; shift 2 ;;
    --ids_per_field) ids_per_field=$2; shift 2 ;;
    --zipf) zipf=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --ps) num_ps=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --checkpoint_every_secs) every=$2; shift 2 ;;
    --torch) torch=$2; shift 2 ;;
    --torch_variants) torch_variants=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --ps_flags) read -r -a cl_ps_flags <<<"$2"; shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "gpu_ctr.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ -z $workers ]]; then
  workers=1
  ((gpus >= 2)) && workers="1 2"
fi
device=${DEVICE:-gpu:{i}}
((gpus <= 1)) && device=${DEVICE:-gpu:0}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_ctr.XXXXXX")
report=$work/gpu_ctr.txt
# shellcheck source=bench/train_cluster.sh
source "$bundle/bench/train_cluster.sh"
cl_from_bundle "$bundle"
cl_data_path=""
cl_model=$bundle/configs/wide_deep_ctr.pbtxt
cl_eval_every=1000000000  # the final evaluation only: the chief's cores stay with the ps tasks
say() { echo "$@" | tee -a "$report"; }
finish() {
  local rc=$?
  if [[ ${#cl_pids[@]} -gt 0 ]]; then cl_stop || true; fi
  [[ -n ${OUT:-} && -d ${OUT:-} ]] && cp "$report" "$OUT/" 2>/dev/null
  echo "==> logs in $work"
  exit "$rc"
}
trap finish EXIT

say "==> $(date -u +%F) $("$runner" chief --version | head -1) on" \
  "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) x $gpus, $(nproc) cores"
t=$SECONDS
data=${data:-$work}
mkdir -p "$data"
if [[ ! -f $data/datagen.out ]]; then
  "$runner" ctr_datagen --train_out="$data/train.txt" --test_out="$data/test.txt" \
    --train_examples="$train_examples" --test_examples=200000 --ids_per_field="$ids_per_field" \
    --zipf_exponent="$zipf" >"$data/datagen.tmp"
  mv "$data/datagen.tmp" "$data/datagen.out"
fi
tee -a "$report" <"$data/datagen.out"
planted=$(sed -nE 's/.*planted_test_auc=([0-9.]+).*/\1/p' "$data/datagen.out")
# The training file's examples (--train_examples, or the earlier run's where --data had data).
train_examples=$(sed -nE 's/^train: .*: ([0-9]+) examples,.*/\1/p' "$data/datagen.out")
if [[ $torch -eq 1 ]]; then
  for part in train test; do
    [[ -f $data/$part.export ]] ||
      "$runner" ctr_export --in="$data/$part.txt" --out_prefix="$data/$part" >"$data/$part.export"
    tee -a "$report" <"$data/$part.export"
  done
fi
say "    data ready in $((SECONDS - t)) s ($data)"

# Ours: one run per worker count.
declare -A ours_rate=() ours_auc=()
status=0
for w in $workers; do
  cl_chief_flags=(--data=criteo --data_path="$data/train.txt" --test_data_path="$data/test.txt")
  if ((every > 0)); then
    cl_chief_flags+=(--checkpoint_dir="$work/ckpt_w$w" --checkpoint_every_secs="$every")
  fi
  run="ours_${w}w${num_ps}ps"
  if ! cl_train_to_end "$run" async "$num_ps" "$w" "$batch" "$epochs" "$device" 1800 0 \
    >"$work/$run.out" 2>&1; then
    say "==> $run FAILED; logs in $cl_dir"
    tail -5 "$work/$run.out" | tee -a "$report"
    status=1
    continue
  fi
  # The chief's final evaluation: "... AUC X (model read at T s of training)".
  line=$(grep -h "evaluation at step" "$cl_dir/chief-0.log" | tail -1)
  auc=$(sed -nE 's/.*AUC ([0-9.]+).*/\1/p' <<<"$line")
  read_at=$(sed -nE 's/.*model read at ([0-9.]+) s of training.*/\1/p' <<<"$line")
  # The training time: the chief's clock (from the first step) when the last worker finished.
  # What the chief does after (a final checkpoint, the evaluation) is not training: the model
  # read time counts it, and it is longer with checkpoints.
  secs=$(sed -nE 's/.* finished after [0-9]+ steps .* at ([0-9.]+) s of training.*/\1/p' \
    "$cl_dir/chief-0.log" | sort -g | tail -1)
  [[ -n $secs ]] || secs=$read_at
  rate=$(awk -v n="$train_examples" -v e="$epochs" -v s="$secs" 'BEGIN {printf "%.0f", n * e / s}')
  ours_rate[$w]=$rate
  ours_auc[$w]=$auc
  # The checkpoints: how long each held the workers, how long its save took (the chief's
  # "checkpoint of step S: the workers were held for D (...), the save took D" lines).
  ckpts=$(python3 - "$cl_dir/chief-0.log" <<'PY'
import re, sys
def seconds(d):  # absl::FormatDuration: "1m2.5s", "850.25ms", "40us"
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    return sum(float(v) * units[u] for v, u in re.findall(r"([0-9.]+)(h|ms|us|ns|m|s)", d))
held, took = [], []
periodic = set()  # the steps of the checkpoints taken during training, not before or after it
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"checkpoint of step (\d+) committed \(periodic", line)
    if m:
        periodic.add(m.group(1))
    m = re.search(r"checkpoint of step (\d+): the workers were held for (\S+) .*the save took (\S+)",
                  line)
    if m and m.group(1) in periodic:
        held.append(seconds(m.group(2)))
        took.append(seconds(m.group(3)))
print("%d checkpoints during training, holding the workers %.2f s in all (longest %.2f s), "
      "saves of %s s" % (len(held), sum(held), max(held, default=0),
                         " / ".join("%.1f" % t for t in took) or "-"))
PY
)
  say "    $run: $rate examples/s over $epochs epochs ($secs s of training; final model read" \
    "at $read_at s), test AUC $auc (planted $planted); $ckpts"
done

best_torch=0
# The config's FTRL learning rate, for the same hyperparameters on both sides.
ftrl_lr=$(sed -nE 's/^[^#]*ftrl \{ learning_rate: ([0-9.]+).*/\1/p' "$cl_model")
if [[ $torch -eq 1 && -z $ftrl_lr ]]; then
  echo "gpu_ctr.sh: no FTRL learning rate found in $cl_model" >&2
  exit 1
fi
if [[ $torch -eq 1 ]]; then
  for variant in $torch_variants; do
    tables=${variant%_compile}
    compile=0
    [[ $variant == *_compile ]] && compile=1
    if python3 "$bundle/bench/torch_ctr.py" --train "$data/train" --test "$data/test" \
      --batch "$batch" --epochs "$epochs" --tables "$tables" --dense_compile "$compile" \
      --ftrl_lr "$ftrl_lr" \
      >"$work/torch_$variant.out" 2>&1
    then
      line=$(grep '^TORCH_CTR' "$work/torch_$variant.out")
      say "    torch $variant: $line"
      r=$(grep -o 'examples_per_second=[0-9]*' <<<"$line" | cut -d= -f2)
      a=$(grep -o 'test_auc=[0-9.]*' <<<"$line" | cut -d= -f2)
      if ((r > best_torch)); then
        best_torch=$r
        best_torch_auc=$a
        best_torch_variant=$variant
      fi
    else
      say "==> torch $variant FAILED:"
      tail -5 "$work/torch_$variant.out" | tee -a "$report"
      status=1
    fi
  done
fi
if ((best_torch > 0)); then
  say "BENCH gpu_ctr_torch_1gpu $best_torch ex/s (test AUC $best_torch_auc, planted $planted;" \
    "batch $batch, $epochs epochs, $best_torch_variant)"
fi
for w in $workers; do
  [[ -n ${ours_rate[$w]:-} ]] || continue
  ratio=""
  ((best_torch > 0)) && ratio=$(awk -v a="${ours_rate[$w]}" -v b="$best_torch" \
    'BEGIN {printf " ratio=%.2f", a / b}')
  say "BENCH gpu_ctr_${w}w${num_ps}ps ${ours_rate[$w]} ex/s$ratio (test AUC ${ours_auc[$w]}," \
    "planted $planted; batch $batch per worker, $epochs epochs, async)"
done
exit $status
