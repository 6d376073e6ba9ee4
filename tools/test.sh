#!/usr/bin/env bash
# Runs every test once (offline; installs what the build needs first):
#   1. under AddressSanitizer and UBSan (--config=asan: clang, whose build of every other target
#      also checks the lock annotations, -Wthread-safety -Werror): every unit test, and the
#      daemon tests of the ps data path, psctl, the lifecycle, TLS and replication's failover;
#   2. the other multi-process tests (tests/, deploy/: the real daemons, as users run them, in
#      the default build: gcc, -O2), and the unit test of what ASan changes
#      (common:huge_page_pool_test: its pool is bypassed under ASan).
# Arguments go to both `bazel test` commands (CI passes --test_env=FAULT_SEED=...). Each build
# has its own output tree. `bazel test //...` alone runs every test in the default build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
sanitized=(//tests:ps_cluster_test //tests:ps_transport_test //tests:psctl_test
  //tests:lifecycle_test //tests:tls_test //tests:failover_test)
echo "==> unit tests and ${sanitized[*]} under ASan + UBSan (--config=asan)"
bazel test --config=asan "$@" -- //... -//tests/... -//deploy/... "${sanitized[@]}"
echo "==> the other multi-process tests (default build)"
bazel test --build_tests_only "$@" -- //tests/... //deploy/... //common:huge_page_pool_test \
  "${sanitized[@]/#/-}"
