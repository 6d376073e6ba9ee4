#!/usr/bin/env bash
# bench/ps.sh on the GPU machine's many cores, from the device bundle (bench/gpu_prepare.sh):
# the bundle's chief, ps_server, ps_bench and iperf3 (with their libraries) and its
# certificates, since that machine has no Bazel, no iperf3 and perhaps no openssl command.
# Every argument goes to ps.sh, e.g.
#   bash .devbundle/bench/gpu_ps.sh --tls --configs 1x1 --only d_1MiB,d_16MiB,d_64MiB,emb
# The bundle's certificates name 4 ps tasks and 2 workers: configurations up to 4x2. The bundle's binaries are the --config=cuda build (-O2, assertions on), not ps.sh's
# -c opt. With $OUT set, ps.sh's output is also added to $OUT/gpu_ps.txt (each run after the
# ones before it in the same call, under a line naming its arguments and environment knobs). --ps_binary NAME
# (no slash) runs the bundle's binary of that name (gpu_prepare.sh --extra) as the ps.
set -euo pipefail
bundle=$(cd "$(dirname "$0")/.." && pwd)
called_with="$*"
[[ -f $bundle/payload.tar.gz ]] ||
  { echo "gpu_ps.sh: $bundle/payload.tar.gz is missing; run bench/gpu_prepare.sh" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_ps.XXXXXX")
mkdir -p "$work/payload" "$work/bin"
tar -C "$work/payload" -xzf "$bundle/payload.tar.gz"
for b in chief ps_server ps_bench iperf3; do
  [[ -x $work/payload/bin/$b ]] ||
    { echo "gpu_ps.sh: the bundle has no $b; run bench/gpu_prepare.sh again" >&2; exit 1; }
  printf '#!/usr/bin/env bash\nexec %q %s "$@"\n' "$work/payload/run" "$b" >"$work/bin/$b"
  chmod +x "$work/bin/$b"
done
# Anything else the bundle carries (gpu_prepare.sh --extra), by its name.
for b in "$work"/payload/bin/*; do
  name=$(basename "$b")
  [[ -e $work/bin/$name ]] && continue
  printf '#!/usr/bin/env bash\nexec %q %s "$@"\n' "$work/payload/run" "$name" >"$work/bin/$name"
  chmod +x "$work/bin/$name"
done
export PATH="$work/bin:$PATH"
args=()
while [[ $# -gt 0 ]]; do
  if [[ $1 == --ps_binary && $# -gt 1 && $2 != */* ]]; then
    [[ -x $work/bin/$2 ]] || { echo "gpu_ps.sh: the bundle has no $2" >&2; exit 1; }
    args+=(--ps_binary "$work/bin/$2")
    shift 2
  else
    args+=("$1")
    shift
  fi
done
log=$work/gpu_ps.txt
rc=0
bash "$bundle/bench/ps.sh" --bin_dir "$work/bin" --certs "$bundle/certs" ${args[@]+"${args[@]}"} 2>&1 |
  tee "$log" || rc=$?
if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
  {
    echo "==> gpu_ps.sh $called_with ($( (env | grep -E '^PSCLUSTER_' || true) | sort | tr '\n' ' '))"
    cat "$log"
  } >>"$OUT/gpu_ps.txt"
fi
exit "$rc"
