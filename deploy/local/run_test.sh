#!/usr/bin/env bash
# The README's main command, as a user runs it: deploy/local/run.sh with its defaults (1 chief,
# 2 ps, 2 workers and an evaluator, each its own process; the MLP on the whole of Fashion-MNIST,
# 10 epochs, async), here on the binaries Bazel built (--bin_dir). It must show progress
# (psctl watch), end with the final test accuracy the README quotes (0.88xx; at least 0.87
# here), and stop every task cleanly (each exits 0).
set -euo pipefail
root=${TEST_SRCDIR:?run me with bazel test}/pscluster
bin=$TEST_TMPDIR/bin
mkdir -p "$bin"
for b in chief/chief ps_server/ps_server worker/worker cli/psctl evaluator/evaluator; do
  ln -sf "$root/$b" "$bin/$(basename "$b")"
done
out=$TEST_TMPDIR/run.out
rc=0
TMPDIR=$TEST_TMPDIR bash "$root/deploy/local/run.sh" --bin_dir "$bin" >"$out" 2>&1 || rc=$?
fail() {
  echo "run_test: FAILED: $1" >&2
  echo "--- run.sh's output (last 40 lines):" >&2
  tail -40 "$out" >&2
  logs=$(sed -n 's/^==> logs: //p' "$out")
  for f in "$logs"/*.log; do [[ -f $f ]] && { echo "--- $f" >&2; tail -8 "$f" >&2; }; done
  exit 1
}
[[ $rc -eq 0 ]] || fail "run.sh exited $rc"
grep -q '^==> training (psctl --chief=.* watch)' "$out" || fail "no psctl watch"
progress=$(grep -cE '^\[ *[0-9.]+s\] step +[0-9]+ +epoch +[0-9]+/10 ' "$out" || true)
[[ $progress -ge 2 ]] || fail "psctl watch printed $progress progress lines, expected some"
accuracy=$(sed -n 's/^final test accuracy: //p' "$out")
[[ -n $accuracy ]] || fail "no final test accuracy"
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.87) }' || fail "final test accuracy $accuracy < 0.87"
for task in chief:0 ps:0 ps:1 worker:0 worker:1 evaluator:0; do
  grep -q "^    $task exited 0\$" "$out" || fail "$task did not exit 0"
done
grep -q '^==> checkpoints: .*ckpt-' "$out" || fail "no checkpoint listed"
echo "run_test: final test accuracy $accuracy after $progress progress lines; every task exited 0"
