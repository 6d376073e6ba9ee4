#!/usr/bin/env bash
# Multi-host runs without a cluster: every task in its own Linux network namespace, as on its
# own machine. A "switch" namespace holds a bridge; each task's namespace has a veth to it, its
# own IP in 10.231.0.0/24 and a hosts file (ip netns exec mounts /etc/netns/<ns>/hosts) naming
# every "host". TF_CONFIG names the tasks by host name, so the daemons bind their interfaces,
# not loopback, and talk across the bridge (plaintext: --allow_insecure, which a non-loopback
# bind requires without TLS).
#
#   1. chief, 2 ps and 2 workers train to the end (async, the chief with
#      --exit_after_training): every task exits 0.
#   2. again, with 5% packet loss into ps-1 (nftables), ps-1's link capped at 20 Mbit/s (tc
#      tbf), and worker-1's link down for 4 s in the middle of training: training still
#      finishes, every task exits 0, and the chief saw worker:1 go missing and come back.
#   3. replicated (--replication=2, 3 ps tasks): ps-1 cut off from the chief alone (nftables)
#      for 5 s in the middle of training, the workers still reaching it. Its lease runs out
#      before the chief fails it over, it applies no push from then to its exit, it hears that
#      it was failed over once the cut heals, and training finishes on the backups: every task
#      exits 0.
#
# Runs as root (CI does); otherwise it fails, saying so: a test that cannot run does not pass.
# Needs ip (iproute2), nft (nftables) and tc (tools/setup.sh installs them).
#   bazel test //tests:netns_test     or     bash tests/netns_test.sh BIN_DIR CONFIG_DIR
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  echo "netns_test: FAILED: cannot run: making network namespaces needs root (CI runs as root;" \
    "run it as root: sudo bazel test //tests:netns_test)" >&2
  exit 1
fi
for tool in ip nft tc; do
  command -v "$tool" >/dev/null || { echo "netns_test: $tool not found (tools/setup.sh installs it)" >&2; exit 1; }
done

if [[ -n ${TEST_SRCDIR:-} ]]; then
  root=$TEST_SRCDIR/pscluster
  launcher=$root/deploy/local/cluster.sh
  declare -A bin=([chief]=$root/chief/chief [ps]=$root/ps_server/ps_server [worker]=$root/worker/worker)
  configs=$root/configs
  work=$TEST_TMPDIR
else
  bin_dir=${1:?usage: netns_test.sh BIN_DIR CONFIG_DIR}
  declare -A bin=([chief]=$bin_dir/chief [ps]=$bin_dir/ps_server [worker]=$bin_dir/worker)
  configs=${2:?usage: netns_test.sh BIN_DIR CONFIG_DIR}
  launcher=$(dirname "$0")/../deploy/local/cluster.sh
  work=$(mktemp -d)
fi

# Names unique to this run, so that runs side by side do not collide.
run=psc$$
switch=$run-sw
tasks=(chief-0 ps-0 ps-1 ps-2 worker-0 worker-1)
declare -A ip_of=([chief-0]=10.231.0.10 [ps-0]=10.231.0.20 [ps-1]=10.231.0.21
  [ps-2]=10.231.0.22 [worker-0]=10.231.0.30 [worker-1]=10.231.0.31)
ns_of() { echo "$run-$1"; }
link_of() { echo "${run}${1//-/}"; }  # the switch side of a task's veth (at most 15 chars)

cleanup() {
  for t in "${tasks[@]}"; do
    ip netns pids "$(ns_of "$t")" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$(ns_of "$t")" 2>/dev/null || true
    rm -rf "/etc/netns/$(ns_of "$t")"
  done
  ip netns del "$switch" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$switch"
ip -n "$switch" link add br0 type bridge
ip -n "$switch" link set br0 up
hosts_file=$work/hosts
: >"$hosts_file"
echo "127.0.0.1 localhost" >>"$hosts_file"
for t in "${tasks[@]}"; do echo "${ip_of[$t]} $t.hosts.test" >>"$hosts_file"; done
for t in "${tasks[@]}"; do
  ns=$(ns_of "$t")
  ip netns add "$ns"
  mkdir -p "/etc/netns/$ns"
  cp "$hosts_file" "/etc/netns/$ns/hosts"
  ip link add "$(link_of "$t")" netns "$switch" type veth peer name eth0 netns "$ns"
  ip -n "$switch" link set "$(link_of "$t")" master br0 up
  ip -n "$ns" addr add "${ip_of[$t]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done
# Each host resolves the others' names through its own hosts file.
[[ $(ip netns exec "$(ns_of worker-1)" getent hosts ps-1.hosts.test) == "${ip_of[ps-1]}"* ]] ||
  { echo "netns_test: worker-1's namespace does not resolve ps-1.hosts.test" >&2; exit 1; }
echo "netns_test: ${#tasks[@]} hosts on a bridge: $(tr '\n' ' ' <"$hosts_file")"

port=2222
ps_list() {  # the TF_CONFIG ps list of the first N ps hosts
  local i out=""
  for ((i = 0; i < $1; i++)); do out+="${out:+,}\"ps-$i.hosts.test:$port\""; done
  echo "$out"
}
set_spec() {  # number of ps tasks
  spec="\"chief\":[\"chief-0.hosts.test:$port\"],\"ps\":[$(ps_list "$1")],\"worker\":[\"worker-0.hosts.test:$port\",\"worker-1.hosts.test:$port\"]"
}
set_spec 2
# Starting and waiting: the launcher every script of the repository shares, each task inside
# its host's namespace.
# shellcheck source=deploy/local/cluster.sh
source "$launcher"
start() {  # task logfile flags...
  local t=$1 log=$2
  shift 2
  local job=${t%-*} index=${t##*-}
  cl_spawn "$t" "$log" "{\"cluster\":{$spec},\"task\":{\"type\":\"$job\",\"index\":$index}}" \
    ip netns exec "$(ns_of "$t")" "${bin[$job]}" --allow_insecure "$@"
}

train() {  # name fault: none, worker_link (worker-1's link down 4 s) or ps1_cut (replicated)
  local name=$1 fault=$2
  local dir=$work/$name num_ps=2
  local extra=(--checkpoint_dir="$dir/checkpoints" --checkpoint_every_secs=5)
  if [[ $fault == ps1_cut ]]; then
    # Three ps tasks, every dense partition backed up on another (no checkpoints: a failover
    # is what keeps the model).
    num_ps=3
    extra=(--replication=2 --max_partition_bytes=8192)
  fi
  set_spec "$num_ps"
  # The shared checkpoint directory exists before any task starts, as a mounted one would.
  mkdir -p "$dir/checkpoints"
  start chief-0 "$dir/chief-0.log" --model_config="$configs/softmax_regression.pbtxt" \
    --mode=async --max_train_examples=12000 --max_test_examples=2000 --epochs=3 \
    --batch_size=50 --eval_every_secs=60 --heartbeat_interval_ms=200 \
    --heartbeat_timeout_ms=1500 --exit_after_training "${extra[@]}"
  local i
  for ((i = 0; i < num_ps; i++)); do
    start "ps-$i" "$dir/ps-$i.log" --checkpoint_dir="$dir/checkpoints"
  done
  local step_delay=()
  [[ $fault != none ]] && step_delay=(--step_delay_ms=20)  # long enough for the faults to land
  for t in worker-0 worker-1; do start "$t" "$dir/$t.log" ${step_delay[@]+"${step_delay[@]}"}; done

  if [[ $fault != none ]]; then
    for _ in $(seq 300); do
      grep -q -- "-> training" "$dir/chief-0.log" 2>/dev/null && break
      sleep 0.1
    done
    sleep 1
  fi
  if [[ $fault == worker_link ]]; then
    echo "netns_test: $name: worker-1's link down for 4 s"
    ip -n "$switch" link set "$(link_of worker-1)" down
    sleep 4
    ip -n "$switch" link set "$(link_of worker-1)" up
  elif [[ $fault == ps1_cut ]]; then
    # ps-1 and the chief no longer reach each other; the workers and the other ps tasks still
    # reach ps-1.
    local ps1 chief_ip=${ip_of[chief-0]}
    ps1=$(ns_of ps-1)
    echo "netns_test: $name: ps-1 cut off from the chief for 5 s"
    ip netns exec "$ps1" nft add table inet cut
    ip netns exec "$ps1" nft add chain inet cut input '{ type filter hook input priority 0; }'
    ip netns exec "$ps1" nft add chain inet cut output '{ type filter hook output priority 0; }'
    ip netns exec "$ps1" nft add rule inet cut input ip saddr "$chief_ip" drop
    ip netns exec "$ps1" nft add rule inet cut output ip daddr "$chief_ip" drop
    sleep 5
    ip netns exec "$ps1" nft delete table inet cut
  fi

  # Every task must exit 0 by itself; one that fails ends the wait at once.
  local failed=0 t
  cl_dir=$dir
  cl_await_exit 240 || failed=1
  if [[ $failed -ne 0 ]] || ! grep -q "training finished" "$dir/chief-0.log"; then
    for t in "${tasks[@]}"; do
      [[ -f $dir/$t.log ]] && { echo "--- $t"; tail -15 "$dir/$t.log"; }
    done >&2
    echo "netns_test: $name: FAILED" >&2
    exit 1
  fi
  echo "netns_test: $name: trained to the end; $(grep -o 'training finished: final test accuracy [0-9.]*' "$dir/chief-0.log" | head -1); every task exited 0"
}

train clean none

# Faults: 5% of the packets into ps-1 dropped, its link capped, worker-1 cut off for a while.
ps1=$(ns_of ps-1)
ip netns exec "$ps1" nft add table inet loss
ip netns exec "$ps1" nft add chain inet loss input '{ type filter hook input priority 0; }'
ip netns exec "$ps1" nft add rule inet loss input numgen random mod 100 '<' 5 drop
tc -n "$ps1" qdisc add dev eth0 root tbf rate 20mbit burst 32kbit latency 400ms
echo "netns_test: faults: 5% loss into ps-1, ps-1 capped at 20 Mbit/s"
train faults worker_link
grep -q "worker:1 is back after" "$work/faults/chief-0.log" ||
  { echo "netns_test: the chief never saw worker:1 come back" >&2; tail -30 "$work/faults/chief-0.log" >&2; exit 1; }
echo "netns_test: faults: the chief saw worker:1 missing and back: $(grep -o 'worker:1 is back after.*' "$work/faults/chief-0.log" | head -1)"
# Replicated, ps-1 cut off from the chief: fenced by its lease before the chief failed it over.
nft_del() { ip netns exec "$ps1" nft delete table inet loss 2>/dev/null || true; }
nft_del
tc -n "$ps1" qdisc del dev eth0 root 2>/dev/null || true
train replicated ps1_cut
dir=$work/replicated
fail() { echo "netns_test: replicated: $1" >&2; tail -20 "$dir/chief-0.log" "$dir/ps-1.log" >&2; exit 1; }
failed_over=$(grep -h "ps:1 failed over" "$dir/chief-0.log" | head -1)
lapsed=$(grep -h "the lease from the chief ran out" "$dir/ps-1.log" | head -1)
fenced=$(grep -h "the chief failed this ps task over" "$dir/ps-1.log" | head -1)
stopped=$(grep -h "ps:1 stopped:" "$dir/ps-1.log" | tail -1)
[[ -n $failed_over ]] || fail "the chief did not fail ps:1 over"
[[ -n $lapsed ]] || fail "ps-1 never refused for want of a lease"
[[ -n $fenced ]] || fail "ps-1 never heard that it was failed over"
[[ -n $stopped ]] || fail "ps-1 did not log its pushes at exit"
# glog's time of day (the same clock: one machine); the lease ran out first.
when() { awk '{print $2}' <<<"$1"; }
[[ $(when "$lapsed") < $(when "$failed_over") ]] ||
  fail "ps-1's lease ran out at $(when "$lapsed"), after the failover at $(when "$failed_over")"
pushes() { grep -o '[0-9]* pushes applied' <<<"$1" | awk '{print $1}'; }
[[ $(pushes "$lapsed") == "$(pushes "$fenced")" && $(pushes "$fenced") == "$(pushes "$stopped")" ]] ||
  fail "ps-1 applied pushes after its lease ran out: $(pushes "$lapsed") then, $(pushes "$fenced") when fenced, $(pushes "$stopped") at exit"
echo "netns_test: replicated: ps-1's lease ran out at $(when "$lapsed"), the chief failed it over at $(when "$failed_over"); ps-1 applied $(pushes "$lapsed") pushes before and none after"
echo "netns_test: PASSED"
