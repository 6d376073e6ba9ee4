#!/bin/sh
# Container entrypoint: builds TF_CONFIG from the StatefulSet pod's ordinal and the cluster
# size, then runs the daemon of this job. Environment: JOB (chief|ps|worker), NUM_PS,
# NUM_WORKERS, PORT (default 2222), SERVICE (the headless service's name, default pscluster),
# ALLOW_INSECURE (1: serve plaintext when no certificates are mounted).
# Mutual TLS: the job's Secret (make_tls_secrets.sh) mounted at /etc/pscluster/tls holds
# ca.pem and <job>-<index>.pem/.key; this task uses its own by the pod's ordinal.
set -eu
port=${PORT:-2222}
svc=${SERVICE:-pscluster}
index=${HOSTNAME##*-}
hosts() {  # job count
  i=0; out=""
  while [ "$i" -lt "$2" ]; do
    out="$out${out:+,}\"$1-$i.$svc:$port\""; i=$((i + 1))
  done
  echo "$out"
}
TF_CONFIG=$(printf '{"cluster":{"chief":[%s],"ps":[%s],"worker":[%s]},"task":{"type":"%s","index":%s}}' \
  "$(hosts chief 1)" "$(hosts ps "$NUM_PS")" "$(hosts worker "$NUM_WORKERS")" "$JOB" "$index")
export TF_CONFIG
tls_dir=/etc/pscluster/tls
if [ -f "$tls_dir/ca.pem" ]; then
  if [ ! -f "$tls_dir/$JOB-$index.pem" ]; then
    echo "entrypoint: $tls_dir has no $JOB-$index.pem (make_tls_secrets.sh for more tasks?)" >&2
    exit 2
  fi
  set -- --tls_ca_file="$tls_dir/ca.pem" --tls_cert_file="$tls_dir/$JOB-$index.pem" \
    --tls_key_file="$tls_dir/$JOB-$index.key" "$@"
elif [ "${ALLOW_INSECURE:-0}" = 1 ]; then
  set -- --allow_insecure "$@"
fi
case "$JOB" in
  chief) exec /opt/pscluster/bin/chief "$@" ;;
  ps) exec /opt/pscluster/bin/ps_server "$@" ;;
  worker) exec /opt/pscluster/bin/worker "$@" ;;
  *) echo "entrypoint: unknown JOB \"$JOB\" (expected chief, ps or worker)" >&2; exit 2 ;;
esac
