#!/usr/bin/env bash
# Runs tests/recovery_test.cc's SyncFailoverTest over many random kill points: replication 2,
# sync training of the recovery tests' model, one ps task killed with SIGKILL at a random global
# step (started again or left dead); every trial must end with the undisturbed run's model bit
# for bit, with nothing restored or computed again (docs/replication.md).
#
#   bash tests/failover_campaign.sh [ROUNDS] [SEED]
#
# Each round runs the test's three cases with PSCLUSTER_FAILOVER_SEED set to SEED + round (so
# three kill points a round); SEED defaults to a random one (printed: the same SEED replays the
# same points). Prints one FAILOVER line per trial and a summary; exits non-zero if any trial
# failed. About 20 s a round on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
seed=${2:-$((RANDOM * 32768 + RANDOM))}
echo "==> failover campaign: $rounds rounds (3 trials each) from seed $seed"
bash tools/setup.sh >/dev/null
log_dir=$(bazel info bazel-testlogs 2>/dev/null)/tests/recovery_test
passed=0
failed=0
for ((r = 0; r < rounds; r++)); do
  rc=0
  bazel test //tests:recovery_test --test_filter='Seeds/SyncFailoverTest.*' \
    --test_env=PSCLUSTER_FAILOVER_SEED=$((seed + r)) --nocache_test_results \
    --test_output=errors --ui_event_filters=-info --noshow_progress >/dev/null 2>&1 || rc=$?
  # One line per case: its kill point, then whether it passed.
  while IFS= read -r line; do
    case "$line" in
      *"SIGKILL of ps:"*) point=${line#*] } ;;
      *"[       OK ] Seeds/SyncFailoverTest"*)
        echo "FAILOVER ok   $point"
        passed=$((passed + 1)) ;;
      *"[  FAILED  ] Seeds/SyncFailoverTest"*" ms)"*)
        echo "FAILOVER FAIL $point (round $r: see $log_dir/test.log)"
        failed=$((failed + 1)) ;;
    esac
  done < "$log_dir/test.log"
  if [[ $rc -ne 0 ]]; then
    cp "$log_dir/test.log" "/tmp/failover_campaign.$((seed + r)).log"
    echo "==> round $r failed; its log: /tmp/failover_campaign.$((seed + r)).log" >&2
  fi
done
echo "==> $passed trials passed, $failed failed (seed $seed)"
[[ $failed -eq 0 && $passed -eq $((rounds * 3)) ]]
