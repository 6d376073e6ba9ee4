#!/usr/bin/env bash
# Makes a cluster's CA and one certificate per task and per psctl level, with openssl.
#
#   deploy/tls/make_certs.sh --out DIR --cluster NAME \
#       --chief_hosts h:p --ps_hosts h:p,h:p --worker_hosts h:p,... [--evaluator_hosts h:p] \
#       [--days 365] [--ca_dir DIR]
#
# Writes into DIR (created, mode 0700):
#   ca.pem ca.key                      the CA (made unless --ca_dir names an existing one)
#   chief-0.pem chief-0.key            one pair per task of the spec: ps-0, worker-1, ...
#   psctl-viewer.pem/.key              psctl, read-only
#   psctl-admin.pem/.key               psctl, may also take checkpoints
# Each certificate names its holder as a URI in its subject alternative names,
# spiffe://NAME/<job>/<index> or spiffe://NAME/psctl/<viewer|admin> (security/identity.h), and a
# task's certificate also names its host from the spec (DNS or IP), which clients verify.
# Give each process only its own key. --days may be negative (an expired certificate, for tests).
set -euo pipefail

out="" cluster="" days=365 ca_dir=""
declare -A hosts=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --cluster) cluster="$2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --ca_dir) ca_dir="$2"; shift 2 ;;
    --chief_hosts|--ps_hosts|--worker_hosts|--evaluator_hosts)
      job="${1#--}"; hosts["${job%_hosts}"]="$2"; shift 2 ;;
    --out=*|--cluster=*|--days=*|--ca_dir=*|--*_hosts=*)
      set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "make_certs.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$out" || -z "$cluster" ]]; then
  echo "make_certs.sh: --out and --cluster are required (see --help)" >&2
  exit 2
fi
if ! [[ "$cluster" =~ ^[a-z0-9._-]{1,63}$ ]]; then
  echo "make_certs.sh: --cluster '$cluster': expected 1-63 of [a-z0-9._-]" >&2
  exit 2
fi
if ! [[ "$days" =~ ^-?[0-9]+$ ]]; then
  echo "make_certs.sh: --days '$days': expected a whole number" >&2
  exit 2
fi
command -v openssl >/dev/null || { echo "make_certs.sh: openssl not found (apt-get install openssl)" >&2; exit 2; }

umask 077
mkdir -p "$out"
ca_dir="${ca_dir:-$out}"
if [[ ! -f "$ca_dir/ca.pem" ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
    -keyout "$ca_dir/ca.key" -out "$ca_dir/ca.pem" -days 3650 \
    -subj "/O=pscluster/CN=pscluster CA for $cluster" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi
[[ "$ca_dir" == "$out" ]] || cp "$ca_dir/ca.pem" "$out/ca.pem"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# issue NAME URI [SAN...]: NAME.pem and NAME.key, signed by the CA.
issue() {
  local name="$1" uri="$2"; shift 2
  local san="URI:$uri"
  for extra in "$@"; do san="$san,$extra"; done
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
    -keyout "$out/$name.key" -out "$tmp/$name.csr" -subj "/O=pscluster/CN=$name" 2>/dev/null
  cat > "$tmp/$name.ext" <<EXT
subjectAltName=$san
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
EXT
  openssl x509 -req -in "$tmp/$name.csr" -CA "$ca_dir/ca.pem" -CAkey "$ca_dir/ca.key" \
    -CAcreateserial -CAserial "$tmp/ca.srl" -sha256 -days "$days" -extfile "$tmp/$name.ext" \
    -out "$out/$name.pem" 2>/dev/null
  chmod 0644 "$out/$name.pem"
}

# host_san HOST: the subject alternative name of a host, IP or DNS.
host_san() {
  local host="$1"
  host="${host#[}"; host="${host%]}"
  if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then echo "IP:$host"; else echo "DNS:$host"; fi
}

for job in chief ps worker evaluator; do
  [[ -n "${hosts[$job]:-}" ]] || continue
  IFS=',' read -r -a list <<< "${hosts[$job]}"
  for i in "${!list[@]}"; do
    hostport="${list[$i]}"
    host="${hostport%:*}"
    issue "$job-$i" "spiffe://$cluster/$job/$i" "$(host_san "$host")"
  done
done
issue psctl-viewer "spiffe://$cluster/psctl/viewer"
issue psctl-admin "spiffe://$cluster/psctl/admin"
chmod 0644 "$out/ca.pem"
echo "make_certs.sh: certificates for cluster $cluster in $out (valid $days days)"
