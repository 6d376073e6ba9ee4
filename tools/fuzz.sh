#!/usr/bin/env bash
# Runs every fuzz target (fuzz/BUILD) with libFuzzer, ASan and UBSan: docs/fuzzing.md.
#   bash tools/fuzz.sh [SECONDS_PER_TARGET]     (default 60)
# Installs nothing (tools/setup.sh does: clang, libfuzzer-14-dev). Builds with --config=asan
# (clang, ASan, UBSan and libFuzzer's coverage; outputs in k8-fastbuild-asan, beside the usual
# ones, so CI's sanitizer tests and this script share one build; FUZZ_OUTPUT_BASE=DIR builds in
# an output base of its own instead, with a Bazel server that does not wait on the usual one's),
# then runs each target for the given time from a scratch copy of its seed corpus
# (fuzz/corpus/<target>/ is only read). Prints one line per target: executions, seconds,
# crashes. Exits 1 if any target crashed, naming the input that did it; the scratch directory
# ($FUZZ_SCRATCH, default a new /tmp/ps-fuzz.XXXXXX) is kept and holds each target's log.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -lt 1 ]]; then
  echo "usage: bash tools/fuzz.sh [SECONDS_PER_TARGET]" >&2
  exit 2
fi
command -v clang >/dev/null || { echo "fuzz.sh: clang is not installed (tools/setup.sh)" >&2; exit 2; }
[[ -e /usr/lib/llvm-14/lib/libFuzzer.a ]] || echo "fuzz.sh: warning: libfuzzer-14-dev is not installed (tools/setup.sh)" >&2

# Every target of fuzz/BUILD; FUZZ_TARGETS="npy_reader_fuzzer ..." runs only those.
all_targets="cluster_spec_fuzzer wire_codec_fuzzer manifest_fuzzer shard_record_fuzzer"
all_targets+=" npy_reader_fuzzer data_reader_fuzzer parameter_store_fuzzer sealed_channel_fuzzer"
read -r -a targets <<<"${FUZZ_TARGETS:-$all_targets}"
bazel=(bazel)
if [[ -n ${FUZZ_OUTPUT_BASE:-} ]]; then
  bazel=(bazel --output_base="$FUZZ_OUTPUT_BASE")
  # That Bazel server is stopped at the end (the build cache stays): nothing lingers.
  trap '"${bazel[@]}" shutdown >/dev/null 2>&1 || true' EXIT
fi
build_flags=(--config=asan --symlink_prefix=/)  # "/": no bazel-* links over the usual ones

# ld.gold warns once per ASan helper symbol ("Cannot export local symbol"): harmless, dropped.
"${bazel[@]}" build "${build_flags[@]}" "${targets[@]/#/\/\/fuzz:}" 2>&1 |
  { grep -v "warning: Cannot export local symbol" || true; }
bin=$("${bazel[@]}" info "${build_flags[@]}" bazel-bin 2>/dev/null)

scratch=${FUZZ_SCRATCH:-$(mktemp -d /tmp/ps-fuzz.XXXXXX)}
mkdir -p "$scratch"
echo "fuzz.sh: ${seconds}s per target; corpora, logs and crashes under $scratch"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# FUZZ_SEED=N makes the inputs tried the same from run to run (CI uses it); unset, each run
# explores afresh.
seed_flag=""
[[ -n ${FUZZ_SEED:-} ]] && seed_flag="-seed=$FUZZ_SEED"

summary=()
crashed=()
for t in "${targets[@]}"; do
  dir=$scratch/$t
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp fuzz/corpus/"$t"/* "$dir/corpus/"
  start=$(date +%s)
  rc=0
  # -rss_limit_mb: the parameter store fuzzer holds a ps task; 2 GiB flags a runaway allocation.
  "$bin/fuzz/$t" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 $seed_flag \
      -timeout=25 -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
  elapsed=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -n 1)
  if [[ -z $execs ]]; then
    # A crash ends the run before the final stats: take the last progress line's count.
    execs=$(sed -n 's/^#\([0-9][0-9]*\)[[:space:]].*/\1/p' "$dir/log" | tail -n 1)
  fi
  mapfile -t found < <(find "$dir/artifacts" -type f | sort)
  n=${#found[@]}
  if [[ $rc -ne 0 && $n -eq 0 ]]; then n=1; found=("(no input saved; see $dir/log)"); fi
  line=$(printf '%-24s executions %10s  seconds %5s  crashes %d' "$t" "${execs:-?}" "$elapsed" "$n")
  echo "$line"
  summary+=("$line")
  if [[ $n -gt 0 ]]; then
    for f in "${found[@]}"; do crashed+=("$t: $f"); done
    grep -m 1 -E 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error|FUZZ_CHECK' \
      "$dir/log" | sed 's/^/    /' || true
  fi
done

echo
echo "fuzz.sh summary (${seconds}s per target, logs in $scratch):"
printf '  %s\n' "${summary[@]}"
if [[ ${#crashed[@]} -gt 0 ]]; then
  echo "fuzz.sh: crashes; the inputs that caused them:" >&2
  printf '  %s\n' "${crashed[@]}" >&2
  exit 1
fi
echo "fuzz.sh: no crashes"
