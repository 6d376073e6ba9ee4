#!/usr/bin/env bash
# The main job: starts a local cluster (1 chief, 2 ps, 2 workers and an evaluator by default,
# each a separate process on 127.0.0.1), trains the MLP on Fashion-MNIST, shows progress, prints
# the final test accuracy, and shuts everything down cleanly (also on Ctrl-C).
#
#   bash deploy/local/run.sh [--mode async|sync|ssp] [--ps N] [--workers N]
#                            [--model configs/mlp.pbtxt] [--epochs N] [--batch_size N]
#                            [--device cpu|gpu:N[,gpu:M...]] [--no_evaluator] [--hold]
#                            [--tls] [--bin_dir DIR] [--data KIND] [--data_path PATH]
#                            [--test_data_path FILE] [--train_examples N]
#                            [--test_examples N] [--ids_per_field N] [-- extra chief flags]
#
# The evaluator task evaluates the live model on the test set while training and at the end,
# on the workers' first device; with --no_evaluator the chief does it (on its CPU).
# --tls runs every channel on mutual TLS with certificates made on the fly by
# deploy/tls/make_certs.sh (cluster "local"; psctl runs as viewer); see docs/security.md.
# --hold keeps the cluster up after training until Ctrl-C. Logs and metrics go to a fresh
# folder under $TMPDIR (default /tmp), printed at the start. --bin_dir runs prebuilt binaries
# (DIR/chief, DIR/ps_server, DIR/worker, DIR/psctl and DIR/evaluator (without it: no
# evaluator task), DIR/ctr_datagen for a CTR model, with DIR/../lib on the library path, as in
# the device bundle of bench/gpu_prepare.sh) instead of installing and building.
# --data is the chief's --data (fashion_mnist, libsvm, criteo, csv, synthetic_ctr; docs/data.md);
# --data_path is the Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist) or the
# training file, --test_data_path the test file.
# A CTR model (a SIGMOID_CROSS_ENTROPY loss, e.g. --model configs/wide_deep.pbtxt) without
# --data trains on synthetic click logs in the Criteo layout, which //model/data:ctr_datagen
# writes into the run's folder (--train_examples, default 500000; --test_examples, 50000;
# --ids_per_field, 100; 5 epochs unless --epochs), and ends with the test AUC beside the AUC of
# the planted model that drew the clicks: the best any model can reach on that test file.
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=async
num_ps=2
num_workers=2
model=configs/mlp.pbtxt
epochs=""
batch_size=128
device=cpu
hold=0
tls=0
evaluator=1
bin_dir=""
data=""
data_path=""
test_data_path=""
train_examples=500000
test_examples=50000
ids_per_field=100
chief_extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --mode) mode=$2; shift 2 ;;
    --ps) num_ps=$2; shift 2 ;;
    --workers) num_workers=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch_size) batch_size=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --hold) hold=1; shift ;;
    --tls) tls=1; shift ;;
    --no_evaluator) evaluator=0; shift ;;
    --bin_dir) bin_dir=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --data_path) data_path=$2; shift 2 ;;
    --test_data_path) test_data_path=$2; shift 2 ;;
    --train_examples) train_examples=$2; shift 2 ;;
    --test_examples) test_examples=$2; shift 2 ;;
    --ids_per_field) ids_per_field=$2; shift 2 ;;
    --) shift; chief_extra=("$@"); break ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

[[ -f $model ]] || { echo "run.sh: no model config $model" >&2; exit 2; }
# A CTR model without --data trains on synthetic Criteo-layout data generated below.
synthetic_criteo=0
if [[ -z $data ]] && grep -Eq '^\s*loss:\s*SIGMOID_CROSS_ENTROPY' "$model"; then
  synthetic_criteo=1
  data=criteo
fi
[[ -n $epochs ]] || epochs=$([[ $synthetic_criteo -eq 1 ]] && echo 5 || echo 10)

# Where each binary is.
declare -A binary
if [[ -z $bin_dir ]]; then
  bash tools/setup.sh >/dev/null
  echo "==> building the daemons"
  bazel build --ui_event_filters=-info --noshow_progress //chief //ps_server //worker //cli:psctl \
    //evaluator //model/data:ctr_datagen
  bin=$(bazel info bazel-bin 2>/dev/null)
  binary=([chief]=$bin/chief/chief [ps_server]=$bin/ps_server/ps_server
          [worker]=$bin/worker/worker [psctl]=$bin/cli/psctl [evaluator]=$bin/evaluator/evaluator
          [ctr_datagen]=$bin/model/data/ctr_datagen)
else
  bin_dir=$(cd "$bin_dir" && pwd)
  [[ -d $bin_dir/../lib ]] && export LD_LIBRARY_PATH="$bin_dir/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  binary=([chief]=$bin_dir/chief [ps_server]=$bin_dir/ps_server [worker]=$bin_dir/worker
          [psctl]=$bin_dir/psctl [evaluator]=$bin_dir/evaluator
          [ctr_datagen]=$bin_dir/ctr_datagen)
  if [[ $evaluator -eq 1 && ! -x ${binary[evaluator]} ]]; then
    echo "run.sh: no $bin_dir/evaluator: running without an evaluator task (the chief evaluates)"
    evaluator=0
  fi
  if [[ $synthetic_criteo -eq 1 && ! -x ${binary[ctr_datagen]} ]]; then
    echo "run.sh: no $bin_dir/ctr_datagen to write synthetic CTR data: pass --data criteo" \
      "--data_path FILE --test_data_path FILE" >&2
    exit 2
  fi
fi
absolute() {  # path: the same path, absolute (a folder or a file)
  if [[ -d $1 ]]; then (cd "$1" && pwd); else echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; fi
}
# The chief names the data; workers and the evaluator get the Fashion-MNIST folder too.
data_flag=()
chief_data=()
[[ -n $data ]] && chief_data+=(--data="$data")
if [[ -n $data_path ]]; then
  chief_data+=(--data_path="$(absolute "$data_path")")
  [[ -d $data_path ]] && data_flag=(--data_path="$(absolute "$data_path")")
fi
[[ -n $test_data_path ]] && chief_data+=(--test_data_path="$(absolute "$test_data_path")")

work=$(mktemp -d "${TMPDIR:-/tmp}/pscluster.XXXXXX")
echo "==> logs and metrics in $work"

# Starting, stopping and TF_CONFIG: the launcher every script of the repository shares.
# shellcheck source=deploy/local/cluster.sh
source deploy/local/cluster.sh
cl_dir=$work
cl_with_evaluator=$evaluator
launch() { exec "${binary[$1]}" "${@:2}"; }
# --tls: a CA and one certificate per task and per psctl level, for this run only.
if [[ $tls -eq 1 ]]; then
  cl_tls_dir=$work/certs
  hosts() { local out="" i; for ((i = 0; i < $1; i++)); do out+="${out:+,}127.0.0.1:0"; done; echo "$out"; }
  eval_hosts=()
  [[ $evaluator -eq 1 ]] && eval_hosts=(--evaluator_hosts 127.0.0.1:0)
  bash deploy/tls/make_certs.sh --out "$work/certs" --cluster local --chief_hosts 127.0.0.1:0 \
    --ps_hosts "$(hosts "$num_ps")" --worker_hosts "$(hosts "$num_workers")" \
    ${eval_hosts[@]+"${eval_hosts[@]}"} >/dev/null
  echo "==> mutual TLS on every channel: certificates in $work/certs"
fi
# shellcheck disable=SC2207
psctl_tls=($(cl_tls_flags psctl-viewer))

planted_auc=""
if [[ $synthetic_criteo -eq 1 ]]; then
  input_dim=$(sed -nE 's/^\s*input_dim:\s*([0-9]+).*/\1/p' "$model" | head -1)
  echo "==> writing synthetic click logs in the Criteo layout ($train_examples training and" \
    "$test_examples test examples, ${input_dim:-13} integer and 26 categorical columns," \
    "$ids_per_field values per column)"
  "${binary[ctr_datagen]}" --train_out="$work/criteo_train.txt" \
    --test_out="$work/criteo_test.txt" --train_examples="$train_examples" \
    --test_examples="$test_examples" --ids_per_field="$ids_per_field" \
    --num_int="${input_dim:-13}" | tee "$work/ctr_datagen.out" | sed 's/^/    /'
  planted_auc=$(sed -n 's/^planted_test_auc=//p' "$work/ctr_datagen.out")
  chief_data+=(--data_path="$work/criteo_train.txt" --test_data_path="$work/criteo_test.txt"
               --criteo_int_columns="${input_dim:-13}")
fi

trap 'echo; echo "==> interrupted: stopping every task"; cl_stop; exit 130' INT TERM
# Whatever ends the script, no task outlives it.
trap 'if [[ ${#cl_pids[@]} -gt 0 ]]; then echo "==> stopping every task"; cl_stop || true; fi' EXIT

start_task() {  # binary job index chief_address [flags...]: the script ends if it does not start
  cl_start_task "$1" "$2" "$3" "$4" "$num_ps" "$num_workers" "${@:5}" && return 0
  cl_stop quiet || true
  exit 1
}

echo "==> starting 1 chief, $num_ps ps, $num_workers workers$([[ $evaluator -eq 1 ]] && echo ", 1 evaluator") ($mode, $(basename "$model"), $epochs epochs)"
start_task chief chief 0 "127.0.0.1:0" --model_config="$model" --mode="$mode" \
  --epochs="$epochs" --batch_size="$batch_size" --metrics_file="$work/metrics.jsonl" \
  --checkpoint_dir="$work/checkpoints" --checkpoint_every_secs=20 \
  ${chief_data[@]+"${chief_data[@]}"} ${chief_extra[@]+"${chief_extra[@]}"}
chief=$(cl_chief_address)
for ((i = 0; i < num_ps; i++)); do
  start_task ps_server ps "$i" "$chief" --checkpoint_dir="$work/checkpoints"
done
for ((i = 0; i < num_workers; i++)); do
  start_task worker worker "$i" "$chief" --device="$device" ${data_flag[@]+"${data_flag[@]}"}
done
if [[ $evaluator -eq 1 ]]; then
  # On the workers' first device: a GPU evaluates while it trains.
  start_task evaluator evaluator 0 "$chief" --device="${device%%,*}" \
    ${data_flag[@]+"${data_flag[@]}"}
fi

for _ in $(seq 100); do
  if "${binary[psctl]}" ${psctl_tls[@]+"${psctl_tls[@]}"} --chief="$chief" status 2>/dev/null | grep -q "all tasks serving"; then break; fi
  sleep 0.1
done
echo "==> psctl --chief=$chief status"
# A task unreachable for a moment shows in the table (and makes psctl exit 1); training goes on.
"${binary[psctl]}" ${psctl_tls[@]+"${psctl_tls[@]}"} --chief="$chief" status || true
echo "==> training (psctl --chief=$chief watch)"
status=0
"${binary[psctl]}" ${psctl_tls[@]+"${psctl_tls[@]}"} --chief="$chief" --interval_secs=5 watch || status=$?

if [[ $hold -eq 1 ]]; then
  echo "==> cluster up; Ctrl-C stops it"
  while true; do sleep 1; done
fi
echo "==> stopping every task (SIGTERM)"
cl_stop || status=1
if [[ -n $planted_auc ]]; then
  test_auc=$(tail -1 "$work/metrics.jsonl" 2>/dev/null | sed -nE 's/.*"test_auc": ([-0-9.]+).*/\1/p')
  if [[ -n $test_auc ]]; then
    gap=$(awk -v p="$planted_auc" -v t="$test_auc" 'BEGIN { printf "%.4f", p - t }')
    LC_ALL=C printf "==> test AUC %.4f; the planted model's %.4f (gap %s)\n" "$test_auc" \
      "$planted_auc" "$gap"
  else
    echo "==> no evaluation in $work/metrics.jsonl; the planted model's test AUC is $planted_auc"
  fi
fi
echo "==> logs: $work"
echo "==> checkpoints: $work/checkpoints ($(cd "$work/checkpoints" 2>/dev/null && ls -d ckpt-* 2>/dev/null | tr '\n' ' '))"
exit $status
