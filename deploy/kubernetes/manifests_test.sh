#!/usr/bin/env bash
# Renders every overlay and checks the manifests and the entrypoint (check_manifests.py).
# Needs kubectl (for its kustomize) and Debian's python3-kubernetes (tools/setup.sh).
set -euo pipefail
root=${TEST_SRCDIR:?run me with bazel test}/pscluster
export HOME=${TEST_TMPDIR:-/tmp}  # kubectl keeps a cache there
exec /usr/bin/python3 "$root/deploy/kubernetes/check_manifests.py" "$root"
