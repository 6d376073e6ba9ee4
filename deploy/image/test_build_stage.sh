#!/usr/bin/env bash
# "The image builds", measured without a container engine: runs the Dockerfile's two stages
# in clean Debian 12 roots made with debootstrap from the package mirror.
#   1. build root (debootstrap bookworm): the committed tree (git archive HEAD) at /src, then
#      deploy/image/build_stage.sh /out, as the Dockerfile's build stage runs it;
#   2. runtime root (debootstrap --variant=minbase, as slim as debian:12-slim): only the
#      packages of /out/runtime-packages.txt and dataset-fashion-mnist, /out/opt/pscluster, a
#      non-root user; then, as that user, every binary's --version, the entrypoint's
#      TF_CONFIG, and a short training run (chief, ps and worker on 127.0.0.1, the chief with
#      --exit_after_training): each task must exit 0.
# --gpu: the GPU image's stages (Dockerfile GPU=1). NVIDIA's repositories are not reachable
# from here, so this machine's CUDA tree (/usr/local/cuda: the toolkit, cuBLAS and NCCL) stands
# in for NVIDIA's packages in the build root (mounted read-only); the build stage builds with
# --config=cuda_portable and copies the CUDA libraries the binaries load, which the runtime
# root gets in /opt/pscluster/lib as the image does. Then also: every binary's libraries
# resolve in the runtime root (ldd), which has no CUDA tree of its own.
# Root only (debootstrap, chroot, mounts). 296 s on this 2-core machine (2026-11-27), most of
# it apt and Bazel in the build root.
#
#   bash deploy/image/test_build_stage.sh [--gpu] [--work DIR] [--mirror URL] [--keep]
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
work=/var/tmp/pscluster-image-test
mirror=http://deb.debian.org/debian
keep=0
gpu=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --gpu) gpu=1; shift ;;
    --work) work=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "test_build_stage.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "test_build_stage.sh: needs root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap

build=$work/build-root
runtime=$work/runtime-root
mounted=()
cleanup() {
  local m
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  [[ $keep -eq 1 ]] || rm -rf --one-file-system "$work"
}
trap cleanup EXIT
mount_system() {  # root
  for d in proc sys dev dev/pts; do
    mkdir -p "$1/$d"
    mount --bind "/$d" "$1/$d"
    mounted+=("$1/$d")
  done
  cp /etc/resolv.conf "$1/etc/resolv.conf"
}
in_root() {  # root command...
  local root=$1
  shift
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}
start=$(date +%s)
step() { echo "==> [$(( $(date +%s) - start )) s] $*"; }

# A run killed before its cleanup may have left its bind mounts of /proc, /sys and /dev under
# $work: undo them before deleting anything, and never cross into another filesystem.
if [[ -d $work ]]; then
  findmnt -rno TARGET | grep "^$work/" | sort -r | xargs -r -n1 umount -l
  rm -rf --one-file-system "$work"
fi
mkdir -p "$work"
step "debootstrap bookworm (build root) from $mirror"
debootstrap bookworm "$build" "$mirror" >"$work/debootstrap-build.log" 2>&1 ||
  { tail -20 "$work/debootstrap-build.log"; exit 1; }
mount_system "$build"
gpu_flag=()
if [[ $gpu -eq 1 ]]; then
  cuda=$(readlink -f /usr/local/cuda)
  [[ -x $cuda/bin/nvcc ]] || { echo "test_build_stage.sh: --gpu needs the CUDA toolkit in /usr/local/cuda" >&2; exit 2; }
  step "--gpu: this machine's $cuda (nvcc $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), NCCL: $(ls "$cuda"/lib64/libnccl.so.* 2>/dev/null | head -1 | xargs -r basename)) read-only in the build root, for NVIDIA's packages"
  mkdir -p "$build$cuda"
  mount --bind "$cuda" "$build$cuda"
  mounted+=("$build$cuda")
  mount -o remount,bind,ro "$build$cuda"
  [[ $cuda == /usr/local/cuda ]] || ln -sfn "$(basename "$cuda")" "$build/usr/local/cuda"
  gpu_flag=(--gpu)
fi
step "the committed tree ($(git rev-parse --short HEAD)) at /src"
mkdir -p "$build/src"
git archive HEAD | tar -x -C "$build/src"
step "build stage: bash deploy/image/build_stage.sh /out ${gpu_flag[*]}"
in_root "$build" PSCLUSTER_COMMIT="$(git rev-parse --short=12 HEAD)" \
  bash -c "cd /src && bash deploy/image/build_stage.sh /out ${gpu_flag[*]}" 2>&1 | tee "$work/build-stage.log" | grep -E '^(==>|setup:)' || true
[[ ${PIPESTATUS[0]} -eq 0 && -x $build/out/opt/pscluster/bin/chief ]] ||
  { echo "test_build_stage.sh: the build stage failed; see $work/build-stage.log" >&2; tail -30 "$work/build-stage.log"; keep=1; exit 1; }

step "debootstrap --variant=minbase bookworm (runtime root)"
debootstrap --variant=minbase bookworm "$runtime" "$mirror" >"$work/debootstrap-runtime.log" 2>&1 ||
  { tail -20 "$work/debootstrap-runtime.log"; exit 1; }
mount_system "$runtime"
step "runtime stage: $(tr '\n' ' ' <"$build/out/runtime-packages.txt")dataset-fashion-mnist"
cp "$build/out/runtime-packages.txt" "$runtime/tmp/"
in_root "$runtime" bash -c 'apt-get update -q && xargs -a /tmp/runtime-packages.txt apt-get install -y -q --no-install-recommends dataset-fashion-mnist' \
  >"$work/runtime-apt.log" 2>&1 || { tail -20 "$work/runtime-apt.log"; exit 1; }
cp -a "$build/out/opt/pscluster" "$runtime/opt/"
if [[ -d $build/out/cuda-libs ]]; then
  # As the Dockerfile's runtime stage: the CUDA libraries in /opt/pscluster/lib, on ld.so's path.
  mkdir -p "$runtime/opt/pscluster/lib"
  cp -a "$build/out/cuda-libs/." "$runtime/opt/pscluster/lib/"
  echo /opt/pscluster/lib >"$runtime/etc/ld.so.conf.d/pscluster.conf"
  in_root "$runtime" ldconfig
  echo "    CUDA libraries: $(ls "$runtime/opt/pscluster/lib" | tr '\n' ' ')"
elif [[ $gpu -eq 1 ]]; then
  echo "test_build_stage.sh: --gpu: the build stage copied no CUDA libraries" >&2; keep=1; exit 1
fi
in_root "$runtime" useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin pscluster
ln -sf /opt/pscluster/bin/psctl "$runtime/usr/local/bin/psctl"
echo "    runtime root: $(du -sh --exclude=proc --exclude=sys --exclude=dev "$runtime" 2>/dev/null | cut -f1)" \
  "(/opt/pscluster: $(du -sh "$runtime/opt/pscluster" | cut -f1))"

step "every binary's libraries resolve in the runtime root (ldd)"
for b in "$runtime"/opt/pscluster/bin/*; do
  missing=$(in_root "$runtime" ldd "/opt/pscluster/bin/$(basename "$b")" | grep "not found" || true)
  [[ -z $missing ]] || { echo "$(basename "$b"): $missing" >&2; keep=1; exit 1; }
done
echo "    $(ls "$runtime/opt/pscluster/bin" | tr '\n' ' '): every library found"
if [[ $gpu -eq 1 ]]; then
  in_root "$runtime" ldd /opt/pscluster/bin/worker | grep -E "cublas|cudart|nccl" | sed 's/^\s*/    worker: /'
  in_root "$runtime" ldd /opt/pscluster/bin/worker | grep -q "/opt/pscluster/lib/libcublas" ||
    { echo "test_build_stage.sh: --gpu: the worker does not load cuBLAS from /opt/pscluster/lib" >&2; keep=1; exit 1; }
fi

as_user() { chroot --userspec=10001:10001 "$runtime" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp "$@"; }
step "each binary runs as the non-root user"
for b in chief ps_server worker evaluator psctl; do
  out=$(as_user "/opt/pscluster/bin/$b" --version) || { echo "$b --version failed: $out" >&2; exit 1; }
  echo "    $out"
done

step "entrypoint.sh builds this pod's TF_CONFIG in the runtime root"
as_user /usr/bin/env JOB=ps NUM_PS=2 NUM_WORKERS=2 PORT=2222 HOSTNAME=pscluster-ps-1 \
  JOB_COMPLETION_INDEX=1 PSCLUSTER_DRY_RUN=1 /opt/pscluster/entrypoint.sh | sed 's/^/    /'

step "a short training run as the non-root user: chief, 1 ps, 1 worker on 127.0.0.1"
logs=$runtime/tmp/run
# The shared checkpoint directory exists before the tasks start, as a mounted one would.
mkdir -p "$logs/checkpoints" && chmod 777 "$logs" "$logs/checkpoints"
port=$((20000 + RANDOM % 20000))
spec="\"chief\":[\"127.0.0.1:$port\"],\"ps\":[\"127.0.0.1:$((port + 1))\"],\"worker\":[\"127.0.0.1:$((port + 2))\"]"
pids=()
task() {  # job index binary flags...
  local job=$1 index=$2 binary=$3
  shift 3
  # Each task gets 3 minutes: one that waits forever for another fails the check.
  as_user /usr/bin/timeout 180 /usr/bin/env GLOG_logtostderr=1 TF_CONFIG="{\"cluster\":{$spec},\"task\":{\"type\":\"$job\",\"index\":$index}}" \
    "/opt/pscluster/bin/$binary" "$@" >"$logs/$job-$index.log" 2>&1 &
  pids+=($!)
}
task chief 0 chief --model_config=/opt/pscluster/configs/softmax_regression.pbtxt \
  --max_train_examples=6000 --max_test_examples=1000 --epochs=1 --exit_after_training \
  --checkpoint_dir=/tmp/run/checkpoints
task ps 0 ps_server --checkpoint_dir=/tmp/run/checkpoints
task worker 0 worker
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
tail -3 "$logs"/chief-0.log | sed 's/^/    chief: /'
[[ $status -eq 0 ]] || { echo "test_build_stage.sh: a task exited non-zero; logs in $logs" >&2; keep=1; exit 1; }
grep -q "training finished" "$logs/chief-0.log" || { echo "no 'training finished' in the chief's log" >&2; keep=1; exit 1; }
step "PASS: the build stage built on a clean Debian 12, and the runtime stage trained to the end and exited 0"
