#!/usr/bin/env bash
# Checkpoint and recovery times of the MLP (configs/mlp.pbtxt) on Fashion-MNIST, in one run
# (the figures of docs/checkpoints.md, "Measured"):
#   (a) a sync cluster of 1 chief, 2 ps, 2 workers, trained undisturbed for --epochs epochs,
#       with a checkpoint every --every steps;
#   (b) the same cluster again, with ps:1 killed by SIGKILL --kill_after seconds into training
#       and started again at its address 1 s later (as a supervisor would).
# From the chief's log: each checkpoint's size and time, the time from the restarted ps
# registering to the end of the recovery, the restore itself, the steps computed again; and
# the final test accuracy of both runs, which sync recovery should leave unchanged.
#
# Prints the lines
#   BENCH mlp_checkpoint_ms <median ms> ms bytes=<bytes>
#   BENCH mlp_restore_ms <ms> ms
#   BENCH mlp_recovery_ms <ms> ms steps_recomputed=<n>
#   BENCH mlp_accuracy_after_ps_kill <acc> ratio=<acc / undisturbed acc>
#
#   bash bench/recovery.sh [--epochs N] [--every N] [--kill_after S] [--keep_logs]
set -euo pipefail
cd "$(dirname "$0")/.."

epochs=3
every=200
kill_after=6
keep_logs=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --kill_after) kill_after=$2; shift 2 ;;
    --keep_logs) keep_logs=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "recovery.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

bash tools/setup.sh >/dev/null
echo "==> building (default config): chief, ps_server, worker, cluster_probe"
bazel build --ui_event_filters=-info --noshow_progress //chief //ps_server //worker \
  //bench:cluster_probe
bin_dir=$(bazel info bazel-bin 2>/dev/null)
work=$(mktemp -d /tmp/recovery_bench.XXXXXX)
echo "==> logs in $work"
# shellcheck source=bench/train_cluster.sh
source bench/train_cluster.sh
cl_private_bins "$bin_dir" chief/chief ps_server/ps_server worker/worker bench/cluster_probe

status=0
cl_exit_trap recovery.sh

# A field of the chief's ClusterStatus (python expression over `s`).
status_field() {
  cl_status 2>/dev/null | python3 -c "
import json, sys
try:
    s = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
p = s.get('progress', {})
print($1)"
}

await_finished() {
  local _
  for _ in $(seq 1200); do
    [[ $(status_field "p.get('finished', False)") == True ]] && return 0
    sleep 0.5
  done
  echo "recovery.sh: training did not finish in 10 minutes; see $cl_dir" >&2
  return 1
}

run() {  # name [kill]
  local name=$1 kill=${2:-}
  cl_chief_flags=(--checkpoint_dir="$work/$name/checkpoints" --checkpoint_every_steps="$every"
                  --checkpoint_every_secs=0)
  cl_start "$name" sync 2 2 128 "$epochs" cpu
  if [[ -n $kill ]]; then
    sleep "$kill_after"
    local i ps_index=-1 port tf
    for i in "${!cl_names[@]}"; do [[ ${cl_names[$i]} == ps:1 ]] && ps_index=$i; done
    port=$(cat "$cl_dir/ps-1.port")
    echo "    SIGKILL ps:1 (127.0.0.1:$port) at global step $(status_field "s.get('global_step', 0)")"
    kill -KILL "${cl_pids[$ps_index]}"
    wait "${cl_pids[$ps_index]}" 2>/dev/null || true
    sleep 1
    # Back at the address the others know.
    tf=$(cl_tf_config "$cl_chief" ps 1 2 2 |
         python3 -c "import json,sys; c=json.load(sys.stdin); c['cluster']['ps'][1]='127.0.0.1:$port'; print(json.dumps(c))")
    (export TF_CONFIG="$tf"; launch ps_server --port_file="$cl_dir/ps-1.restarted.port") \
      >"$cl_dir/ps-1.restarted.log" 2>&1 &
    cl_pids[$ps_index]=$!
  fi
  await_finished
  status_field "p.get('test_accuracy', p.get('testAccuracy', -1))" >"$cl_dir/accuracy"
  cl_stop
}

echo "==> (a) undisturbed: MLP, sync, 2 ps, 2 workers, $epochs epochs, checkpoint every $every steps"
run undisturbed
echo "==> (b) the same, ps:1 killed after ${kill_after} s and restarted"
run disturbed kill

python3 - "$work" <<'EOF'
import re, statistics, sys
work = sys.argv[1]
def log(name):
    return open(f"{work}/{name}/chief-0.log").read()
def ts(line):
    m = re.match(r"^[IWEF]\d{8} (\d\d):(\d\d):(\d\d\.\d+)", line)
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
ckpt_ms, ckpt_bytes = [], []
for name in ("undisturbed", "disturbed"):
    for m in re.finditer(r"checkpoint of step (\d+) committed \([^)]*\): ([\d.]+) MiB in ([\d.]+) ms",
                         log(name)):
        ckpt_ms.append(float(m.group(3)))
        ckpt_bytes.append(float(m.group(2)) * 1048576)
lines = log("disturbed").splitlines()
registered = [l for l in lines if "ps:1 restarted (new incarnation)" in l]
recovered = [l for l in lines if "recovery of ps:1:" in l]
restore = re.search(r"restored checkpoint .* in ([\d.]+)(ms|s)", log("disturbed"))
acc = {n: float(open(f"{work}/{n}/accuracy").read()) for n in ("undisturbed", "disturbed")}
print("==> results")
print(f"    checkpoints: {len(ckpt_ms)}, {statistics.median(ckpt_bytes) / 1048576:.2f} MiB each, "
      f"{min(ckpt_ms):.1f} / {statistics.median(ckpt_ms):.1f} / {max(ckpt_ms):.1f} ms (min / median / max)")
print(f"BENCH mlp_checkpoint_ms {statistics.median(ckpt_ms):.1f} ms bytes={int(statistics.median(ckpt_bytes))}")
if restore:
    ms = float(restore.group(1)) * (1000 if restore.group(2) == "s" else 1)
    print(f"BENCH mlp_restore_ms {ms:.1f} ms")
if registered and recovered:
    m = re.search(r"goes back from (\d+) to (\d+)", recovered[0])
    steps = int(m.group(1)) - int(m.group(2)) if m else -1
    print(f"    {recovered[0].split('] ', 1)[1]}")
    print(f"BENCH mlp_recovery_ms {1000 * (ts(recovered[0]) - ts(registered[0])):.1f} ms "
          f"steps_recomputed={steps}")
else:
    print("recovery.sh: no recovery in the chief's log", file=sys.stderr)
    sys.exit(1)
print(f"    final test accuracy: undisturbed {acc['undisturbed']:.4f}, "
      f"after the ps kill {acc['disturbed']:.4f}")
print(f"BENCH mlp_accuracy_after_ps_kill {acc['disturbed']:.4f} "
      f"ratio={acc['disturbed'] / acc['undisturbed']:.4f}")
EOF
