#!/bin/sh
# The container's entrypoint: runs this pod's task, or probes it.
#
#   entrypoint.sh [FLAGS...]         exec the daemon of $JOB with TF_CONFIG built from the pod
#   entrypoint.sh probe ready|alive  one gRPC health check of the task in this pod (psctl
#                                    health): ready = SERVING (the chief accepted it), alive =
#                                    it answers
#   entrypoint.sh psctl [--admin] COMMAND [FLAGS...]
#                                    psctl COMMAND against this cluster's chief, with the
#                                    operators' viewer (or --admin) certificate from
#                                    $PSCTL_TLS_DIR (default /etc/pscluster/psctl: the chief's
#                                    pod mounts the Secret <service>-tls-psctl there)
#
# Environment: JOB (chief, ps or worker); NUM_PS, NUM_WORKERS and PORT (the cluster's
# ConfigMap); HOSTNAME, which an Indexed Job's pod has as <service>-<job>-<index> with the
# headless Service <service> as its subdomain, so every task is <service>-<job>-<i>.<service>;
# JOB_COMPLETION_INDEX (set by the Job controller; else the host name's last part);
# METRICS_PORT (optional): Prometheus metrics on that port (--metrics_port).
# DATA_PORT (ps only; default 2223): the tensor data plane's port (--data_port), fixed so that
# the NetworkPolicy admits it; mutual TLS with the same certificates as gRPC.
# Mutual TLS: the job's Secret (make_tls_secrets.sh) mounted at $TLS_DIR (default
# /etc/pscluster/tls) holds ca.pem and <job>-<index>.pem/.key. Without it the daemons serve
# plaintext only when ALLOW_INSECURE=1.
# PSCLUSTER_DRY_RUN=1 prints TF_CONFIG and the command instead of running it (CI checks the
# rendered manifests this way).
set -eu

fail() {
  echo "entrypoint: $*" >&2
  exit 2
}
is_count() {  # value: a non-negative decimal integer
  case "$1" in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac
}

[ -n "${JOB:-}" ] || fail "JOB is not set (expected chief, ps or worker)"
case "$JOB" in
  chief | ps | worker) ;;
  *) fail "JOB is \"$JOB\" (expected chief, ps or worker)" ;;
esac
for var in NUM_PS NUM_WORKERS PORT; do
  eval "value=\${$var:-}"
  # shellcheck disable=SC2154  # set by the eval
  is_count "$value" || fail "$var is \"$value\" (expected a whole number, from the cluster's ConfigMap)"
done
[ "$PORT" -gt 0 ] && [ "$PORT" -lt 65536 ] || fail "PORT is $PORT (expected 1-65535)"
metrics_flag=""
data_flag=""
if [ "$JOB" = ps ]; then
  data_port=${DATA_PORT:-2223}
  { is_count "$data_port" && [ "$data_port" -gt 0 ] && [ "$data_port" -lt 65536 ] &&
    [ "$data_port" != "$PORT" ]; } ||
    fail "DATA_PORT is \"$data_port\" (expected 1-65535, not PORT)"
  data_flag="--data_port=$data_port"
fi
if [ -n "${METRICS_PORT:-}" ]; then
  { is_count "$METRICS_PORT" && [ "$METRICS_PORT" -gt 0 ] && [ "$METRICS_PORT" -lt 65536 ]; } ||
    fail "METRICS_PORT is \"$METRICS_PORT\" (expected 1-65535, or unset: no metrics)"
  metrics_flag="--metrics_port=$METRICS_PORT"
fi
[ -n "${HOSTNAME:-}" ] || fail "HOSTNAME is not set"
index=${JOB_COMPLETION_INDEX:-${HOSTNAME##*-}}
is_count "$index" || fail "no task index: JOB_COMPLETION_INDEX is unset and host name $HOSTNAME does not end in -<index>"
suffix="-$JOB-$index"
case "$HOSTNAME" in
  *?"$suffix") ;;
  *) fail "host name $HOSTNAME is not <service>-$JOB-$index (an Indexed Job named <service>-$JOB names its pods so)" ;;
esac
service=${HOSTNAME%"$suffix"}
case "$JOB" in
  chief) count=1 ;;
  ps) count=$NUM_PS ;;
  worker) count=$NUM_WORKERS ;;
esac
[ "$index" -lt "$count" ] || fail "$JOB index $index is not below the cluster's $count $JOB task(s)"

hosts() {  # job count
  i=0
  out=""
  while [ "$i" -lt "$2" ]; do
    out="$out${out:+,}\"$service-$1-$i.$service:$PORT\""
    i=$((i + 1))
  done
  echo "$out"
}

tls_dir=${TLS_DIR:-/etc/pscluster/tls}
tls_flags=""
if [ -f "$tls_dir/ca.pem" ]; then
  [ -f "$tls_dir/$JOB-$index.pem" ] ||
    fail "$tls_dir has no $JOB-$index.pem (make_tls_secrets.sh --ps $NUM_PS --workers $NUM_WORKERS?)"
  tls_flags="--tls_ca_file=$tls_dir/ca.pem --tls_cert_file=$tls_dir/$JOB-$index.pem --tls_key_file=$tls_dir/$JOB-$index.key"
fi
bin=${PSCLUSTER_BIN:-/opt/pscluster/bin}

run() {  # command...
  if [ "${PSCLUSTER_DRY_RUN:-0}" = 1 ]; then
    echo "TF_CONFIG=${TF_CONFIG:-}"
    echo "exec $*"
    exit 0
  fi
  exec "$@"
}

if [ "${1:-}" = psctl ]; then
  shift
  cert=psctl-viewer
  if [ "${1:-}" = --admin ]; then
    cert=psctl-admin
    shift
  fi
  [ "$#" -gt 0 ] || fail "psctl takes a command (status, vars, shard, table, watch, save, ...)"
  psctl_dir=${PSCTL_TLS_DIR:-/etc/pscluster/psctl}
  psctl_tls=""
  if [ -f "$psctl_dir/ca.pem" ]; then
    [ -f "$psctl_dir/$cert.pem" ] ||
      fail "$psctl_dir has no $cert.pem (make_tls_secrets.sh puts psctl-viewer and psctl-admin in the Secret $service-tls-psctl)"
    psctl_tls="--tls_ca_file=$psctl_dir/ca.pem --tls_cert_file=$psctl_dir/$cert.pem --tls_key_file=$psctl_dir/$cert.key"
  elif [ "${ALLOW_INSECURE:-0}" != 1 ]; then
    fail "no operator certificates in $psctl_dir: make the Secret $service-tls-psctl with make_tls_secrets.sh (it is mounted in the chief's pod), or run a cluster with ALLOW_INSECURE=1"
  fi
  # shellcheck disable=SC2086  # the flags are words
  run "$bin/psctl" "$@" --chief="$service-chief-0.$service:$PORT" $psctl_tls
fi

if [ "${1:-}" = probe ]; then
  case "${2:-}" in
    ready) alive="" ;;
    alive) alive="--alive" ;;
    *) fail "probe takes ready or alive, not \"${2:-}\"" ;;
  esac
  # shellcheck disable=SC2086  # the flags are words
  run "$bin/psctl" health "127.0.0.1:$PORT" --tls_server_name="$HOSTNAME.$service" \
    --rpc_timeout_secs=3 $alive $tls_flags
fi

TF_CONFIG=$(printf '{"cluster":{"chief":[%s],"ps":[%s],"worker":[%s]},"task":{"type":"%s","index":%s}}' \
  "$(hosts chief 1)" "$(hosts ps "$NUM_PS")" "$(hosts worker "$NUM_WORKERS")" "$JOB" "$index")
export TF_CONFIG
if [ -z "$tls_flags" ] && [ "${ALLOW_INSECURE:-0}" = 1 ]; then
  tls_flags="--allow_insecure"
elif [ -z "$tls_flags" ]; then
  echo "entrypoint: no certificates in $tls_dir (make_tls_secrets.sh) and ALLOW_INSECURE is not 1: the daemon will refuse to serve plaintext" >&2
fi
case "$JOB" in
  chief) daemon=chief ;;
  ps) daemon=ps_server ;;
  worker) daemon=worker ;;
esac
# shellcheck disable=SC2086
run "$bin/$daemon" $tls_flags $metrics_flag $data_flag "$@"
