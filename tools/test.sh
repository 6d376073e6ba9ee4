#!/usr/bin/env bash
# Runs every test: installs what the build needs, then `bazel test //...` (offline), building
# the tests and what they need (--build_tests_only; `bazel build //...` builds the rest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel test --build_tests_only //... "$@"
