#!/usr/bin/env bash
# The secure cluster against the plaintext one, on the GPU machine, in one call: for each model
# (configs/mlp.pbtxt at batch 1024 with 1 ps task, configs/resnet20.pbtxt at batch 128 with 2,
# as docs/benchmarks.md measures them), a local cluster of 1 chief, the ps tasks and one worker
# --device=gpu:0, async, trained for --seconds of steady state (bench/train_cluster.sh,
# bench/train_rate.py), alternately in plaintext and with mutual TLS on every channel (every
# task its own certificate from deploy/tls/make_certs.sh, the tensor data plane on TLS too),
# --repeats times each (plain, tls, plain, tls, ...). Prints each run's examples/s and
#   BENCH tls_gpu_<model>_b<B>_<P>ps <ex/s> ex/s ratio=<TLS / plaintext, medians of this call>
# From the device bundle (bench/gpu_prepare.sh), on the device machine:
#   bash .devbundle/bench/gpu_tls.sh [--seconds 20] [--warmup 8] [--repeats 2] [--kernel_tls]
#                                    [--specs "mlp 1024 1;resnet20 128 2"]
# --specs: "<config name> <batch> <ps tasks>" runs, separated by ';'.
# --kernel_tls has the ps tasks admit their clients to TLS records, encrypted by the kernel
# where it has kTLS (their logs say whether it had), instead of sealed chunks. With $OUT set the report is also written there.
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)
seconds=20
warmup=8
repeats=2
kernel_tls=0
specs="mlp 1024 1;resnet20 128 2"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --kernel_tls) kernel_tls=1; shift ;;
    --specs) specs=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_tls.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
device=${DEVICE:-gpu:0}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_tls.XXXXXX")
report=$work/gpu_tls.txt
# shellcheck source=bench/train_cluster.sh
source "$bundle/bench/train_cluster.sh"
cl_from_bundle "$bundle"
say() { echo "$@" | tee -a "$report"; }
finish() {
  local rc=$?
  if [[ ${#cl_pids[@]} -gt 0 ]]; then cl_stop || true; fi
  [[ -n ${OUT:-} && -d ${OUT:-} ]] && cp "$report" "$OUT/" 2>/dev/null
  echo "==> logs in $work"
  exit "$rc"
}
trap finish EXIT

# One CA and a certificate for every task (all on 127.0.0.1) and psctl-viewer (the probe's):
# the bundle's (gpu_prepare.sh makes them), or made here.
if [[ -f $bundle/certs/ca.pem ]]; then
  cp -r "$bundle/certs" "$work/certs"
  chmod -R u+rwX,go-rwx "$work/certs"
else
  bash "$bundle/deploy/tls/make_certs.sh" --out "$work/certs" --cluster gpu \
    --chief_hosts 127.0.0.1:0 --ps_hosts 127.0.0.1:0,127.0.0.1:0,127.0.0.1:0,127.0.0.1:0 \
    --worker_hosts 127.0.0.1:0 \
    >/dev/null
fi
say "==> $(date -u +%F) $("$runner" chief --version | head -1) on" \
  "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(nproc) cores"

status=0
IFS=';' read -r -a spec_list <<<"$specs"
for spec in "${spec_list[@]}"; do
  read -r name batch num_ps <<<"$spec"
  cl_model=$bundle/configs/$name.pbtxt
  declare -a plain=() tls=()
  for ((r = 1; r <= repeats; r++)); do
    for mode in plain tls; do
      cl_tls_dir=""
      cl_ps_flags=()
      if [[ $mode == tls ]]; then
        cl_tls_dir=$work/certs
        [[ $kernel_tls -eq 1 ]] && cl_ps_flags=(--data_plane_kernel_tls)
      fi
      run="${name}_b${batch}_${mode}_$r"
      if ! cl_start "$run" async "$num_ps" 1 "$batch" 1000 "$device" ||
        ! cl_measure "$warmup" "$seconds" "$batch" async >/dev/null; then
        say "==> $run FAILED; logs in $cl_dir"
        status=1
        cl_stop || true
        continue
      fi
      cl_stop || status=1
      rate=$(kv examples_per_second "$cl_dir/rate")
      say "    $run: $rate examples/s ($(grep -ho 'tensor data plane on port [0-9]* ([A-Za-z ]*)' \
        "$cl_dir"/ps-0.log | head -1))"
      if [[ $mode == plain ]]; then plain+=("$rate"); else tls+=("$rate"); fi
    done
  done
  python3 - "$name" "$batch" "$num_ps" "${plain[*]:-}" "${tls[*]:-}" <<'PY' | tee -a "$report"
import statistics, sys
name, batch, num_ps = sys.argv[1:4]
plain, tls = sys.argv[4].split(), sys.argv[5].split()
if plain and tls:
    p, t = statistics.median(map(float, plain)), statistics.median(map(float, tls))
    print("BENCH tls_gpu_%s_b%s_%sps %.0f ex/s ratio=%.2f" % (name, batch, num_ps, t, t / p))
    print("    (plaintext median %.0f ex/s; runs plaintext %s, TLS %s)"
          % (p, " ".join(plain), " ".join(tls)))
PY
done
exit $status
