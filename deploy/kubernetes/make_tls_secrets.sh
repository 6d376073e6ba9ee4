#!/usr/bin/env bash
# Makes the cluster's certificates (deploy/tls/make_certs.sh) for the task names the
# Kubernetes manifests give (<service>-<job>-<index>.<service>) and writes them as Kubernetes
# Secrets, one per job, to stdout:
#
#   bash deploy/kubernetes/make_tls_secrets.sh --cluster NAME --ps 2 --workers 2 \
#       [--service pscluster] [--port 2222] [--out DIR] | kubectl apply -f -
#
# --service is the headless Service's rendered name (an overlay's namePrefix included, e.g.
# gpu-pscluster). Secret <service>-tls-<job> holds ca.pem and the certificate and key of each
# task of that job (<job>-<index>.pem/.key); the entrypoint picks its own by the pod's index.
# A pod thus holds the keys of the other tasks of its job (a worker could act as another
# worker), never those of another job. Secret <service>-tls-psctl holds psctl-viewer and
# psctl-admin, for operators. The CA's key stays in --out (default: a fresh temporary folder,
# printed on stderr): keep it offline to issue more certificates later (make_certs.sh --ca_dir).
set -euo pipefail
cd "$(dirname "$0")/../.."

cluster="" num_ps=2 num_workers=2 service=pscluster port=2222 out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cluster) cluster=$2; shift 2 ;;
    --ps) num_ps=$2; shift 2 ;;
    --workers) num_workers=$2; shift 2 ;;
    --service) service=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "make_tls_secrets.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n $cluster ]] || { echo "make_tls_secrets.sh: --cluster is required" >&2; exit 2; }
command -v kubectl >/dev/null || { echo "make_tls_secrets.sh: kubectl not found" >&2; exit 2; }
out=${out:-$(mktemp -d)}

hosts() {  # job count: the stable names entrypoint.sh gives TF_CONFIG
  local list="" i
  for ((i = 0; i < $2; i++)); do list+="${list:+,}$service-$1-$i.$service:$port"; done
  echo "$list"
}
bash deploy/tls/make_certs.sh --out "$out" --cluster "$cluster" \
  --chief_hosts "$(hosts chief 1)" --ps_hosts "$(hosts ps "$num_ps")" \
  --worker_hosts "$(hosts worker "$num_workers")" >&2
echo "make_tls_secrets.sh: CA and certificates in $out (keep ca.key offline)" >&2

secret() {  # name files...
  local name=$1; shift
  local args=()
  for f in "$@"; do args+=(--from-file="$(basename "$f")=$f"); done
  kubectl create secret generic "$name" "${args[@]}" --dry-run=client -o yaml
  echo "---"
}
secret "$service-tls-chief" "$out/ca.pem" "$out"/chief-*.pem "$out"/chief-*.key
secret "$service-tls-ps" "$out/ca.pem" "$out"/ps-*.pem "$out"/ps-*.key
secret "$service-tls-worker" "$out/ca.pem" "$out"/worker-*.pem "$out"/worker-*.key
secret "$service-tls-psctl" "$out/ca.pem" "$out"/psctl-*.pem "$out"/psctl-*.key
