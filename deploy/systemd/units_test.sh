#!/usr/bin/env bash
# Checks the systemd units: `systemd-analyze verify` finds nothing to say about them (with the
# binaries at their built paths), every variable they use is set in cluster.env, and each
# unit's ExecStart, with cluster.env's values and an instance, is a command line its daemon
# accepts (unknown flags are refused; --version then exits 0).
set -euo pipefail
root=${TEST_SRCDIR:?run me with bazel test}/pscluster
units=$TEST_TMPDIR/units
mkdir -p "$units"
declare -A built=([chief]=chief/chief [ps_server]=ps_server/ps_server [worker]=worker/worker)
for f in "$root"/deploy/systemd/*.service; do
  sed_args=()
  for b in "${!built[@]}"; do sed_args+=(-e "s|/opt/pscluster/bin/$b |$root/${built[$b]} |"); done
  sed "${sed_args[@]}" "$f" >"$units/$(basename "$f")"
done
failed=0
cd "$units"
out=$(SYSTEMD_UNIT_PATH="$units:" systemd-analyze verify pscluster-chief.service \
  pscluster-ps@0.service pscluster-worker@1.service 2>&1) || failed=1
if [[ -n $out ]]; then
  echo "systemd-analyze verify:"
  echo "$out"
  failed=1
fi

# The variables the units use are the ones cluster.env sets.
set -a
# shellcheck disable=SC1091
source "$root/deploy/systemd/cluster.env"
set +a
for f in "$root"/deploy/systemd/*.service; do
  for var in $(grep -o '\${\?[A-Z_][A-Z_]*}\?' "$f" | tr -d '${}' | sort -u); do
    if ! grep -q "^$var=" "$root/deploy/systemd/cluster.env"; then
      echo "$(basename "$f") uses \$$var, which cluster.env does not set"
      failed=1
    fi
  done
  # ExecStart as systemd runs it: continuation lines joined, %i the instance, variables from
  # cluster.env (${X} one word, $X split into words).
  line=$(sed -n '/^ExecStart=/,/[^\\]$/p' "$units/$(basename "$f")" | sed 's/\\$//' | tr '\n' ' ')
  line=${line#ExecStart=}
  line=${line//%i/1}
  read -r -a words <<<"$(eval "echo $line")"
  if ! version=$("${words[@]}" --version 2>&1); then
    echo "$(basename "$f"): its ExecStart is refused by the daemon:"
    echo "  ${words[*]}"
    echo "  $version"
    failed=1
  else
    echo "$(basename "$f"): ${words[0]##*/} accepts its flags ($version)"
  fi
done
exit $failed
