#!/usr/bin/env bash
# Runs every test: installs what the build needs, then `bazel test //...` (offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel test //... "$@"
