#!/usr/bin/env bash
# Installs every Debian package the project needs. Idempotent and non-interactive:
# packages already present are skipped, and apt waits for the dpkg lock instead of failing.
set -euo pipefail

PACKAGES=(
  # Build: Debian's Bazel 4.2.3 and the rules it needs offline.
  bazel-bootstrap bazel-rules-java bazel-platforms pkg-config
  # Code generation and the libraries we link.
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev librocksdb-dev libgoogle-glog-dev libgflags-dev
  libgtest-dev libgmock-dev libbenchmark-dev libeigen3-dev zlib1g-dev libssl-dev
  # The data plane's AES-GCM (common/aes_gcm.h): Intel's multi-buffer crypto library.
  libipsec-mb-dev
  # --config=clang (thread-safety analysis); the format check (tools/format.sh).
  clang clang-format
  # --config=fuzz, tools/fuzz.sh: libFuzzer for clang 14 (the sanitizers come with clang).
  libfuzzer-14-dev
  # Benchmarks: the loopback baseline.
  iperf3
  # The default dataset.
  dataset-fashion-mnist
  # Tests and scripts; openssl makes certificates (deploy/tls/make_certs.sh).
  python3 procps openssl
  # The deployment checks: the Kubernetes manifests' schema (python3-kubernetes, with
  # kubectl's kustomize, which is not a Debian package), the systemd units (systemd-analyze).
  python3-kubernetes python3-yaml systemd
  # tests/netns_test.sh: network namespaces, packet loss (nftables) and a rate cap (tc).
  iproute2 nftables
  # Metrics (--metrics_port: prometheus-cpp's core) and the test that scrapes them with a
  # real Prometheus server.
  prometheus-cpp-dev prometheus
)

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# deploy/kubernetes:manifests_test renders the overlays with kubectl's kustomize. The machines
# this project runs on carry kubectl 1.32 (kustomize v5); on one without kubectl, Debian's
# kubernetes-client gives kubectl 1.20, whose kustomize (v2) predates the overlays' components:
# the test then fails and says which kubectl it needs.
if ! command -v kubectl >/dev/null; then
  missing+=(kubernetes-client)
  echo "setup: no kubectl: installing Debian's kubernetes-client (manifests_test needs kubectl" \
    ">= 1.21; see deploy/kubernetes/check_manifests.py)"
fi

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
$SUDO apt-get "${APT_OPTS[@]}" update
# iperf3 asks whether to start a daemon; answer no.
echo "iperf3 iperf3/start_daemon boolean false" | $SUDO debconf-set-selections 2>/dev/null || true
$SUDO apt-get "${APT_OPTS[@]}" install --no-install-recommends "${missing[@]}"
echo "setup: done"
