#!/usr/bin/env bash
# Training throughput on this machine's CPUs, in one run (the figures of docs/benchmarks.md,
# "Training throughput"):
#   (a) train_bench: the MLP (configs/mlp.pbtxt) on Fashion-MNIST in one process, the same
#       kernels and per-step work as a worker (pull, compute, push) against in-process
#       parameter stores, no RPC -- the baseline;
#   (b) a local cluster of 1 chief, 2 ps and 1 CPU worker, async;
#   (c) the same with 2 workers;
#   (d) the same 2 workers in sync mode (SyncReplicas, replicas_to_aggregate = 2);
#   (e) (b) with the worker as it was before the pipelined step and the tensor wire:
#       --pipeline_staleness=0 --ps_transport=grpc, so their gain is measured in the same run.
# Every run uses batch --batch_size per worker. A cluster's figure is its steady state: after
# --warmup seconds of training, the workers' steps over --seconds seconds, read from each
# worker's own progress lines (exact step counts with microsecond timestamps), cross-checked
# against samples of the chief's ClusterStatus (what `psctl status --json` prints; taken with
# bench/cluster_probe), as bench/train_rate.py says. Clusters are stopped
# with SIGTERM and every task must exit 0.
#
# Prints a table and the lines
#   BENCH train_cpu_single_process <ex/s> ex/s ratio=1.00
#   BENCH train_cpu_1w2ps <ex/s> ex/s ratio=<vs single process>
#   BENCH train_cpu_2w2ps <ex/s> ex/s ratio=<vs single process>
#   BENCH train_cpu_2w2ps_sync <ex/s> ex/s ratio=<vs single process>
#   BENCH sync_vs_async_step_time <r> x ratio=<r>
#   BENCH train_cpu_1w2ps_nopipeline_grpc <ex/s> ex/s ratio=<vs single process>
#   BENCH pipeline_and_wire_gain_1w2ps <g> x ratio=<g>   (g = (b) / (e))
# where r = (async examples/s) / (sync examples/s) with the same 2 workers and batch: the
# time of a sync step over that of an async step (each worker does one batch per step).
# Each figure also says how many cores other processes of the machine took meanwhile (a build
# of another session, say), and the script warns when that was more than 0.15: such a figure is
# low. Before each run it waits up to --quiet_wait seconds for the other processes to leave
# the cores (below 0.2 cores busy over a second). About 2.5 minutes after the build on 2 cores
# when the machine is quiet (3 with (e)), at most 2 more waiting for it.
#
#   bash bench/train.sh [--seconds S] [--warmup S] [--batch_size N] [--quiet_wait S]
#                       [--keep_logs]
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=20
warmup=8
batch=128
quiet_wait=30
keep_logs=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --batch_size) batch=$2; shift 2 ;;
    --quiet_wait) quiet_wait=$2; shift 2 ;;
    --keep_logs) keep_logs=1; shift ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "train.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

bash tools/setup.sh >/dev/null
echo "==> building (default config): chief, ps_server, worker, train_bench, cluster_probe"
bazel build --ui_event_filters=-info --noshow_progress //chief //ps_server //worker \
  //bench:train_bench //bench:cluster_probe
bin_dir=$(bazel info bazel-bin 2>/dev/null)

work=$(mktemp -d /tmp/train_bench.XXXXXX)
echo "==> logs in $work"
rate_py=bench/train_rate.py
# shellcheck source=bench/train_cluster.sh
source bench/train_cluster.sh
cl_private_bins "$bin_dir" chief/chief ps_server/ps_server worker/worker bench/train_bench \
  bench/cluster_probe

status=0
cl_exit_trap train.sh

# Waits up to $quiet_wait s until the machine's processes use under 0.2 cores (over 1 s).
await_quiet() {
  local start busy a b tck
  tck=$(getconf CLK_TCK)
  start=$SECONDS
  while true; do
    a=$(awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat)
    sleep 1
    b=$(awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat)
    busy=$(awk -v a="$a" -v b="$b" -v k="$tck" 'BEGIN {printf "%.2f", (b - a) / k}')
    if awk -v x="$busy" 'BEGIN {exit !(x < 0.2)}'; then
      if ((SECONDS - start > 1)); then
        echo "    (waited $((SECONDS - start)) s for other processes to leave the cores)"
      fi
      return 0
    fi
    if ((SECONDS - start >= quiet_wait)); then
      echo "    (other processes keep $busy cores busy; going on after $((SECONDS - start)) s)"
      return 0
    fi
  done
}

cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "==> machine: $(nproc) cores, ${cpu_model:-unknown CPU};" \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"

echo "==> (a) one process, no parameter server RPC: train_bench --device=cpu --batch_size=$batch"
await_quiet
"$work/bin/train_bench" --device=cpu --batch_size="$batch" --warmup_seconds=5 \
  --seconds="$seconds" 2>"$work/train_bench.log" | tee "$work/single"

run_cluster() {  # name mode workers
  local name=$1 mode=$2 workers=$3
  echo "==> ($name) 1 chief + 2 ps + $workers CPU worker(s), $mode, batch $batch"
  await_quiet
  cl_start "$name" "$mode" 2 "$workers" "$batch" 1000 cpu
  cl_measure "$warmup" "$seconds" "$batch" "$mode"
  cp "$cl_dir/rate" "$work/$name.rate"
  cl_stop || status=1
}
run_cluster b async 1
run_cluster c async 2
run_cluster d sync 2
cl_worker_flags=(--pipeline_staleness=0 --ps_transport=grpc)
run_cluster e async 1
cl_worker_flags=()
echo "==> load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$work/single" "$work/b.rate" "$work/c.rate" "$work/d.rate" "$work/e.rate" "$batch" \
  "$(nproc)" "$cpu_model" <<'PY'
import re, sys
def kv(path, prefix):
    line = [l for l in open(path) if l.startswith(prefix)][-1]
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}
s = kv(sys.argv[1], "TRAIN_BENCH ")
b, c, d, e_ = (kv(p, "RATE ") for p in sys.argv[2:6])
batch, cores, cpu = sys.argv[6], sys.argv[7], sys.argv[8]
single = float(s["examples_per_second"])
eps = lambda r: float(r["examples_per_second"])
def cpu_cols(r):
    return (f"{float(r['cpu_ms_per_step_worker']):.2f} / {float(r['cpu_ms_per_step_ps']):.2f} / "
            f"{float(r['cpu_ms_per_step_chief']):.2f}", f"{float(r['cores_busy']):.2f}",
            f"{float(r.get('other_cores_busy', 'nan')):.2f}",
            f"{float(r['status_examples_per_second']):.0f}")
rows = [
    ("one process (train_bench), no RPC", single, float(s["step_ms"]),
     (f"{float(s['cpu_ms']):.2f} (all)", f"{float(s['cores_busy']):.2f}",
      f"{float(s['other_cores_busy']):.2f}", "-")),
    ("1 worker + 2 ps, async", eps(b), float(b["step_ms"]), cpu_cols(b)),
    ("2 workers + 2 ps, async", eps(c), float(c["step_ms"]), cpu_cols(c)),
    ("2 workers + 2 ps, sync", eps(d), float(d["step_ms"]), cpu_cols(d)),
    ("1 worker + 2 ps, async, no pipeline, gRPC", eps(e_), float(e_["step_ms"]), cpu_cols(e_)),
]
sync_vs_async = eps(c) / eps(d)
print()
print(f"Training throughput, MLP 784-256-256-10 (Adam), Fashion-MNIST, batch {batch} per worker, "
      f"CPU kernels; {cores} cores, {cpu}")
print()
print("| run | examples/s | vs one process | step time per worker (ms) "
      "| CPU ms per step: worker / ps / chief | cores busy | other processes (cores) "
      "| status check (ex/s) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name, e, ms, (cpu_ms, busy, other, check) in rows:
    print(f"| {name} | {e:.0f} | {e / single:.2f}x | {ms:.2f} | {cpu_ms} | {busy} | {other} "
          f"| {check} |")
    if float(other) > 0.15:
        print(f"WARNING: other processes used {other} cores during \"{name}\": its figure is "
              f"low; run again on a quiet machine", file=sys.stderr)
print()
print(f"one process, per step (ms): pull {float(s['pull_ms']):.2f}, compute "
      f"{float(s['compute_ms']):.2f}, push {float(s['push_ms']):.2f}, wait for the batch "
      f"{float(s['wait_ms']):.2f}")
print(f"sync vs async step time (2 workers): {sync_vs_async:.2f}x "
      f"(= async ex/s / sync ex/s = sync step time / async step time)")
print()
print(f"BENCH train_cpu_single_process {single:.1f} ex/s ratio=1.00")
print(f"BENCH train_cpu_1w2ps {eps(b):.1f} ex/s ratio={eps(b) / single:.2f}")
print(f"BENCH train_cpu_2w2ps {eps(c):.1f} ex/s ratio={eps(c) / single:.2f}")
print(f"BENCH train_cpu_2w2ps_sync {eps(d):.1f} ex/s ratio={eps(d) / single:.2f}")
print(f"BENCH sync_vs_async_step_time {sync_vs_async:.2f} x ratio={sync_vs_async:.2f}")
print(f"BENCH train_cpu_1w2ps_nopipeline_grpc {eps(e_):.1f} ex/s ratio={eps(e_) / single:.2f}")
print(f"BENCH pipeline_and_wire_gain_1w2ps {eps(b) / eps(e_):.2f} x ratio={eps(b) / eps(e_):.2f}")
PY
exit $status
