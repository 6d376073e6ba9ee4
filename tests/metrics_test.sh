#!/usr/bin/env bash
# Runs tests/metrics_test.py on the built daemons: a live local cluster scraped by Debian's
# real Prometheus server (tools/setup.sh installs it).
set -euo pipefail
root=${TEST_SRCDIR:?run me with bazel test}/pscluster
exec /usr/bin/python3 "$root/tests/metrics_test.py" "$root" "$root/configs" "$TEST_TMPDIR/work" \
  "$root/deploy/grafana/pscluster-dashboard.json"
