#!/usr/bin/env bash
# The image's build stage, as a script so that it can be run and checked without a container
# engine (test_build_stage.sh runs it in a debootstrap'd Debian 12 root). From the repository
# root of a clean Debian 12:
#
#   bash deploy/image/build_stage.sh OUT [--gpu]
#
# installs the build dependencies (tools/setup.sh), builds the daemons and psctl with
# `bazel build -c opt` (--gpu: --config=cuda_portable, which needs the CUDA toolkit in
# /usr/local/cuda and NCCL),
# and lays out what the runtime stage copies:
#   OUT/opt/pscluster/{bin/,entrypoint.sh,configs/,VERSION,systemd/,docs/deploy.md}
#   OUT/runtime-packages.txt   the Debian packages whose libraries the binaries load
#   OUT/cuda-libs/             --gpu: the CUDA runtime, cuBLAS and NCCL libraries they load
#                              (from /usr/local/cuda or NVIDIA's packages)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: build_stage.sh OUT [--gpu]}
gpu=0
[[ ${2:-} == --gpu ]] && gpu=1
mkdir -p "$out"
out=$(cd "$out" && pwd)

bash tools/setup.sh
flags=(-c opt --incompatible_strict_action_env)
# --config=cuda_portable: kernels for every GPU from compute capability 8.0 (.bazelrc).
[[ $gpu -eq 1 ]] && flags+=(--config=cuda_portable)
targets=(//chief //ps_server //worker //evaluator //cli:psctl)
echo "==> bazel build ${flags[*]} ${targets[*]}"
bazel build "${flags[@]}" --ui_event_filters=-info --noshow_progress "${targets[@]}"
bin=$(bazel info "${flags[@]}" bazel-bin 2>/dev/null)

stage=$out/opt/pscluster
rm -rf "$stage" "$out/cuda-libs"
mkdir -p "$stage/bin" "$stage/configs"
for b in chief/chief ps_server/ps_server worker/worker evaluator/evaluator cli/psctl; do
  install -m 0755 "$bin/$b" "$stage/bin/"
done
install -m 0755 deploy/kubernetes/entrypoint.sh "$stage/entrypoint.sh"
install -m 0644 configs/*.pbtxt "$stage/configs/"
install -m 0644 VERSION "$stage/VERSION"
# Per-host launch takes the same tree (docs/deploy.md): the systemd units and their docs.
mkdir -p "$stage/systemd" "$stage/docs"
install -m 0644 deploy/systemd/*.service deploy/systemd/cluster.env "$stage/systemd/"
install -m 0644 docs/deploy.md "$stage/docs/"

# The runtime stage installs exactly the packages that own the libraries the binaries load.
declare -A packages=()
cuda_libs=()
while read -r lib; do
  case "$lib" in
    /usr/local/cuda*) cuda_libs+=("$lib"); continue ;;
  esac
  owner=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -1 | cut -d: -f1) ||
    owner=$(dpkg -S "$lib" 2>/dev/null | head -1 | cut -d: -f1) || true
  [[ -n $owner ]] || { echo "build_stage.sh: no Debian package owns $lib" >&2; exit 1; }
  case "$owner" in
    # Packages of NVIDIA's repository (NCCL's, CUDA's): the runtime stage (debian:12-slim) has
    # no such repository, so their libraries are copied as /usr/local/cuda's are.
    libnccl* | cuda-* | libcublas* | libcudart*)
      cuda_libs+=("$lib")
      continue
      ;;
  esac
  packages[$owner]=1
done < <(ldd "$stage"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
printf '%s\n' "${!packages[@]}" | sort > "$out/runtime-packages.txt"
if [[ ${#cuda_libs[@]} -gt 0 ]]; then
  mkdir -p "$out/cuda-libs"
  for lib in "${cuda_libs[@]}"; do cp -L "$lib" "$out/cuda-libs/"; done
fi
echo "==> $stage: $(ls "$stage/bin" | tr '\n' ' ')"
echo "==> runtime packages: $(tr '\n' ' ' < "$out/runtime-packages.txt")"
