#!/usr/bin/env bash
# Formats every C++ and CUDA source in git with clang-format (.clang-format at the top).
#   bash tools/format.sh           rewrite the files in place
#   bash tools/format.sh --check   change nothing; list the files that differ and exit 1
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format is not installed (tools/setup.sh)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --check ]]; then
  # One clang-format over every file (one process per file took half a minute); it names each
  # file that differs in its warnings.
  bad=()
  if ! out=$(clang-format --dry-run --Werror "${files[@]}" 2>&1); then
    mapfile -t bad < <(grep -oE '^[^: ]+\.(cc|h|cu|cuh):[0-9]+:[0-9]+: error' <<<"$out" |
                         cut -d: -f1 | sort -u)
    [[ ${#bad[@]} -gt 0 ]] || { echo "$out" >&2; exit 2; }
  fi
  if [[ ${#bad[@]} -gt 0 ]]; then
    echo "format.sh: ${#bad[@]} file(s) differ from clang-format's output (run: bash tools/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files formatted as .clang-format says"
  exit 0
fi
clang-format -i "${files[@]}"
