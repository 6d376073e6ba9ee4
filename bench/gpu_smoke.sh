#!/usr/bin/env bash
# Every CUDA and NCCL check, in one call on the GPU machine, from the device bundle
# (bench/gpu_prepare.sh). Run it whenever kernels/, model/, worker/ or the bundle change, and
# record its summary line in docs/gpu_checks.md.
#   1. //kernels:cuda_kernels_test and //worker:cuda_trainer_test (gtest). With two or more
#      GPUs nothing may be skipped: the towers tests (NCCL all-reduce between the GPUs) run.
#   2. A short GPU training run through the daemons that must end by itself (chief
#      --exit_after_training; every task exits 0) while the worker's Prometheus endpoint is
#      scraped for the GPU memory series; with two or more GPUs the worker trains on two
#      towers (--device gpu:0,gpu:1: NCCL in the daemon).
# Every task binds port 0; the chief's port is read back from its --port_file.
#   bash .devbundle/bench/gpu_smoke.sh        (device run, carry [".devbundle"])
#   CUDA_VISIBLE_DEVICES=0 bash .devbundle/bench/gpu_smoke.sh    (the one-GPU case)
# The last line is "gpu_smoke: PASSED ..." or "gpu_smoke: FAILED ...", with the date, the
# commit, the GPUs and the test counts; it is also written to $OUT/gpu_smoke.txt when $OUT is
# set (the device tool brings it back).
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_smoke.XXXXXX")
mkdir -p "$work/payload"
tar -C "$work/payload" -xzf "$bundle/payload.tar.gz"
run=$work/payload/run
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: it can take a host's GPUs out of service
status=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
# CUDA_VISIBLE_DEVICES=0 on a machine of several GPUs checks the one-GPU case.
if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
  gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
fi
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
commit=$("$run" chief --version 2>/dev/null | head -1 || echo unknown)
echo "==> $(date -u +%F) $commit on ${gpus}x ${gpu_name:-no GPU}"
[[ $gpus -ge 1 ]] || { echo "gpu_smoke: FAILED: no GPU (nvidia-smi -L lists none)"; exit 1; }

counts=()
for t in cuda_kernels_test cuda_trainer_test; do
  if "$run" "$t" >"$work/$t.log" 2>&1; then
    passed=$(sed -nE 's/^\[  PASSED  \] ([0-9]+) tests?.*/\1/p' "$work/$t.log" | tail -1)
    skipped=$(sed -nE 's/^\[  SKIPPED \] ([0-9]+) tests?.*/\1/p' "$work/$t.log" | tail -1)
    echo "==> $t: ${passed:-?} passed, ${skipped:-0} skipped"
    counts+=("$t ${passed:-?} passed ${skipped:-0} skipped")
    if [[ $gpus -ge 2 && ${skipped:-0} -gt 0 ]]; then
      echo "==> $t skipped tests on $gpus GPUs:"; grep '^\[  SKIPPED \] [A-Za-z]' "$work/$t.log"
      status=1
    fi
  else
    echo "==> $t FAILED"; grep -E '^\[  FAILED  \]|Failure' "$work/$t.log" | head -20
    tail -20 "$work/$t.log"
    counts+=("$t FAILED")
    status=1
  fi
done

devices=gpu:0
[[ $gpus -ge 2 ]] && devices=gpu:0,gpu:1
# Starting and waiting: the launcher every script of the repository shares.
# shellcheck source=deploy/local/cluster.sh
source "$bundle/deploy/local/cluster.sh"
cl_dir=$work
launch() { exec "$run" "$@"; }
mkdir -p "$work/checkpoints"
cl_start_task chief chief 0 127.0.0.1:0 1 1 \
  --model_config="$bundle/configs/mlp.pbtxt" --data_path="$bundle/data" --epochs=3 \
  --exit_after_training --checkpoint_dir="$work/checkpoints" --eval_every_secs=5 || status=1
chief=$(cl_chief_address)
cl_start_task ps_server ps 0 "$chief" 1 1 --checkpoint_dir="$work/checkpoints" || status=1
cl_start_task worker worker 0 "$chief" 1 1 --device="$devices" --metrics_port=0 \
  --metrics_port_file="$work/worker.metrics" || status=1
for _ in $(seq 200); do [[ -s $work/worker.metrics ]] && break; sleep 0.05; done
# Mid-run: wait until the worker has stepped (its step counter moves), then read its series.
echo "==> the GPU worker's metrics ($devices), mid-run:"
python3 - "$(cat "$work/worker.metrics")" <<'PY' || status=1
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/metrics"
deadline = time.time() + 120
while True:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    lines = [l for l in text.splitlines()
             if l.startswith(("pscluster_worker", "pscluster_rpc_requests_total"))]
    steps = [float(l.split()[-1]) for l in lines if l.startswith("pscluster_worker_steps_total")]
    if steps and steps[0] > 0:
        break
    assert time.time() < deadline, "the worker took no step in 120 s"
    time.sleep(0.2)
print("\n".join("    " + l for l in lines[:12]))
used = [l for l in lines if l.startswith("pscluster_worker_gpu_memory_used_bytes")]
assert used and float(used[0].split()[-1]) > 0, "no GPU memory in use reported"
PY
# Every task must end by itself (the chief's --exit_after_training), and exit 0.
if ! cl_await_exit 600; then status=1; cl_stop quiet || true; fi
finished=$(grep -h "training finished" "$work/chief-0.log" | tail -1 | sed 's/.*training finished/training finished/')
if [[ -n $finished ]]; then echo "==> $finished"; else echo "==> the chief never logged training finished"; fi
[[ -n $finished ]] || status=1

verdict=$([[ $status -eq 0 ]] && echo PASSED || echo FAILED)
line="gpu_smoke: $verdict $(date -u +%F) $commit on ${gpus}x ${gpu_name}: $(IFS=';'; echo "${counts[*]}"); daemons on $devices: ${finished:-did not finish}"
if [[ $status -ne 0 ]]; then
  echo "==> logs:"; for f in "$work"/*.log; do echo "--- $f"; tail -5 "$f"; done
fi
[[ -n ${OUT:-} ]] && echo "$line" >"$OUT/gpu_smoke.txt"
echo "$line"
exit $status
