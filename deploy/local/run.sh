#!/usr/bin/env bash
# Starts a local cluster (1 chief, 2 ps, 2 workers by default), each task a separate process
# on 127.0.0.1, shows every task healthy with `psctl status`, then shuts it down cleanly.
#
#   bash deploy/local/run.sh [--ps N] [--workers N] [--hold]
#
# --hold keeps the cluster up until Ctrl-C. Logs go to a fresh folder under /tmp, printed at start.
set -euo pipefail
cd "$(dirname "$0")/../.."

num_ps=2
num_workers=2
hold=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ps) num_ps=$2; shift 2 ;;
    --workers) num_workers=$2; shift 2 ;;
    --hold) hold=1; shift ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (expected --ps N, --workers N, --hold)" >&2; exit 2 ;;
  esac
done

bash tools/setup.sh >/dev/null
echo "==> building the daemons"
bazel build --ui_event_filters=-info --noshow_progress //chief //ps_server //worker //cli:psctl
bin=$(bazel info bazel-bin 2>/dev/null)

work=$(mktemp -d /tmp/pscluster.XXXXXX)
echo "==> logs in $work"
pids=()
names=()

stop_all() {
  local failed=0
  for i in "${!pids[@]}"; do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
      echo "    ${names[$i]} exited 0"
    else
      echo "    ${names[$i]} exited $?" >&2
      failed=1
    fi
  done
  pids=()
  return $failed
}
trap 'echo; echo "==> interrupted: stopping every task"; stop_all; exit 130' INT TERM

# TF_CONFIG for one task. The chief's address is fixed once it has bound; every other task
# binds port 0 and registers its real address with the chief.
tf_config() {  # chief_address job index
  local ps="" workers="" i
  for ((i = 0; i < num_ps; i++)); do ps+="${ps:+,}\"127.0.0.1:0\""; done
  for ((i = 0; i < num_workers; i++)); do workers+="${workers:+,}\"127.0.0.1:0\""; done
  printf '{"cluster":{"chief":["%s"],"ps":[%s],"worker":[%s]},"task":{"type":"%s","index":%d}}' \
    "$1" "$ps" "$workers" "$2" "$3"
}

start_task() {  # binary job index chief_address
  local port_file="$work/$2-$3.port"
  TF_CONFIG=$(tf_config "$4" "$2" "$3") "$bin/$1" --port_file="$port_file" \
    >"$work/$2-$3.log" 2>&1 &
  pids+=($!)
  names+=("$2:$3")
  for _ in $(seq 200); do [[ -s $port_file ]] && return 0; sleep 0.05; done
  echo "run.sh: $2:$3 did not start; see $work/$2-$3.log" >&2
  tail -5 "$work/$2-$3.log" >&2
  return 1
}

echo "==> starting 1 chief, $num_ps ps, $num_workers workers"
start_task chief/chief chief 0 "127.0.0.1:0"
chief="127.0.0.1:$(cat "$work/chief-0.port")"
for ((i = 0; i < num_ps; i++)); do start_task ps_server/ps_server ps "$i" "$chief"; done
for ((i = 0; i < num_workers; i++)); do start_task worker/worker worker "$i" "$chief"; done

for _ in $(seq 100); do
  if "$bin/cli/psctl" --chief="$chief" status 2>/dev/null | grep -q "all tasks serving"; then break; fi
  sleep 0.1
done
echo "==> psctl --chief=$chief status"
"$bin/cli/psctl" --chief="$chief" status

if [[ $hold -eq 1 ]]; then
  echo "==> cluster up; Ctrl-C stops it"
  while true; do sleep 1; done
fi
echo "==> stopping every task (SIGTERM)"
stop_all
echo "==> done"
