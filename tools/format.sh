#!/usr/bin/env bash
# Formats every C++ and CUDA source in git with clang-format (.clang-format at the top).
#   bash tools/format.sh           rewrite the files in place
#   bash tools/format.sh --check   change nothing; list the files that differ and exit 1
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format is not installed (tools/setup.sh)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
  done
  if [[ ${#bad[@]} -gt 0 ]]; then
    echo "format.sh: ${#bad[@]} file(s) differ from clang-format's output (run: bash tools/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files formatted as .clang-format says"
  exit 0
fi
clang-format -i "${files[@]}"
