#!/usr/bin/env bash
# Runs the fault campaign (tests/fault_campaign_test.cc) with many trials: random single,
# double and triple SIGKILLs of the chief, ps tasks and workers during sync training, each
# killed task restarted by a supervisor, every trial checked against the undisturbed run.
#
#   bash tests/fault_campaign.sh [TRIALS] [SEED]
#
# TRIALS defaults to 100 and SEED to a random one (printed: the same SEED replays the same
# campaign). Prints one CAMPAIGN line per trial and the summary; exits non-zero if any trial
# ended with a wrong model, a stall or a bad checkpoint. About 5 s a trial on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-100}
seed=${2:-$((RANDOM * 32768 + RANDOM))}
echo "==> fault campaign: $trials trials from seed $seed"
bash tools/setup.sh >/dev/null
rc=0
bazel test //tests:fault_campaign_test --test_env=FAULT_TRIALS="$trials" \
  --test_env=FAULT_SEED="$seed" --test_timeout=$((120 + trials * 30)) --nocache_test_results \
  --test_output=errors --ui_event_filters=-info --noshow_progress >/dev/null 2>&1 || rc=$?
log=$(bazel info bazel-testlogs 2>/dev/null)/tests/fault_campaign_test/test.log
grep '^CAMPAIGN' "$log" || { echo "no campaign output; see $log" >&2; exit 1; }
[[ $rc -eq 0 ]] || echo "==> some trials failed (see $log)" >&2
exit $rc
