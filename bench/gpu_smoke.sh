#!/usr/bin/env bash
# On the GPU machine, from the device bundle (bench/gpu_prepare.sh): the CUDA tests, then a
# short GPU training run that must end by itself (chief --exit_after_training; every task
# exits 0) while its worker's Prometheus endpoint is scraped for the GPU memory series.
#   bash .devbundle/bench/gpu_smoke.sh        (device run, carry [".devbundle"])
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_smoke.XXXXXX")
mkdir -p "$work/payload"
tar -C "$work/payload" -xzf "$bundle/payload.tar.gz"
run=$work/payload/run
status=0

for t in cuda_kernels_test cuda_trainer_test; do
  if "$run" "$t" >"$work/$t.log" 2>&1; then
    echo "==> $t: $(grep -E '^\[  PASSED  \]' "$work/$t.log" || echo passed)"
  else
    echo "==> $t FAILED"; tail -20 "$work/$t.log"; status=1
  fi
done

port=$((20000 + RANDOM % 20000))
spec="\"chief\":[\"127.0.0.1:$port\"],\"ps\":[\"127.0.0.1:$((port + 1))\"],\"worker\":[\"127.0.0.1:$((port + 2))\"]"
pids=()
task() {  # job binary flags...
  local job=$1 binary=$2
  shift 2
  TF_CONFIG="{\"cluster\":{$spec},\"task\":{\"type\":\"$job\",\"index\":0}}" \
    "$run" "$binary" "$@" >"$work/$job.log" 2>&1 &
  pids+=($!)
}
task chief chief --model_config="$bundle/configs/mlp.pbtxt" --data_path="$bundle/data" \
  --epochs=3 --exit_after_training --checkpoint_dir="$work/checkpoints" --eval_every_secs=5
mkdir -p "$work/checkpoints"
task ps ps_server --checkpoint_dir="$work/checkpoints"
task worker worker --device=gpu:0 --metrics_port=0 --metrics_port_file="$work/worker.metrics"
for _ in $(seq 100); do [[ -s $work/worker.metrics ]] && break; sleep 0.1; done
sleep 3
echo "==> the GPU worker's metrics, mid-run:"
python3 - "$(cat "$work/worker.metrics")" <<'PY' || status=1
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
lines = [l for l in text.splitlines() if l.startswith(("pscluster_worker", "pscluster_rpc_requests_total"))]
print("\n".join("    " + l for l in lines[:12]))
used = [l for l in lines if l.startswith("pscluster_worker_gpu_memory_used_bytes")]
assert used and float(used[0].split()[-1]) > 0, "no GPU memory in use reported"
PY
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then echo "==> task $i exited non-zero"; status=1; fi
done
grep -h "training finished" "$work/chief.log" | tail -1
[[ $status -eq 0 ]] && echo "==> gpu_smoke: PASSED (every task exited 0)" || { echo "==> gpu_smoke: FAILED; logs:"; tail -5 "$work"/*.log; }
exit $status
