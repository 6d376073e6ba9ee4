#!/usr/bin/env bash
# Run HERE (not on the GPU machine): builds what bench/gpu_train.sh needs with --config=cuda
# (chief, ps_server, worker, evaluator, train_bench, cluster_probe, ps_bench, checkpoint_bench,
# ctr_datagen and ctr_export for bench/gpu_ctr.sh
# (there: `.devbundle/payload/run checkpoint_bench` once the payload is unpacked) and this machine's
# iperf3 for bench/gpu_ps.sh, cuda_kernels_test,
# cuda_trainer_test; and psctl, for looking at the cluster there, left out with a warning when
# it does not build), packs them
# with their shared libraries into a device bundle (../shared/tools/device-bundle; stripped,
# and stored as payload.tar.gz holding its run, bin/ and lib/), and copies in the
# Fashion-MNIST .gz files (data/), the model configs (configs/) and the scripts (bench/).
# The GPU machine has no /usr/share/datasets and no build tools: everything comes from the
# bundle. Then, on the GPU machine (the device tool, carrying the bundle folder):
#   bash .devbundle/bench/gpu_train.sh [--model configs/resnet20.pbtxt] [--epochs_accuracy N]
# (bench/torch_cnn.py there is the PyTorch baseline of models other than the MLP.)
#
#   bash bench/gpu_prepare.sh [--out DIR] [--cpu] [--extra PATH]...
# --out: the bundle folder (default .devbundle, which .git/info/exclude keeps out of git).
# --cpu: build the default (CPU-only) configuration instead, to try gpu_train.sh's logic on a
#        machine without a GPU: DEVICE=cpu bash DIR/bench/gpu_train.sh
# --extra: one more binary for the bundle, under its own file name (for example a ps_server of
#        another commit copied aside as ps_server_old, for gpu_ps.sh --ps_binary ps_server_old).
set -euo pipefail
cd "$(dirname "$0")/.."

out=.devbundle
cuda=1
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --cpu) cuda=0; shift ;;
    --extra) [[ -x $2 ]] || { echo "gpu_prepare.sh: --extra $2 is not an executable" >&2; exit 2; }
      extra+=("$(realpath "$2")"); shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_prepare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
bundler=../shared/tools/device-bundle
[[ -x $bundler ]] || { echo "gpu_prepare.sh: $bundler not found" >&2; exit 1; }
data_dir=/usr/share/datasets/fashion-mnist

bash tools/setup.sh >/dev/null
targets=(//chief //ps_server //worker //evaluator //bench:train_bench //bench:cluster_probe
  //bench:ps_bench //bench:sealed_channel_bench //bench:checkpoint_bench //bench:ctr_export
  //model/data:ctr_datagen)
config=()
if [[ $cuda -eq 1 ]]; then
  targets+=(//kernels:cuda_kernels_test //worker:cuda_trainer_test)
  config=(--config=cuda)
fi
echo "==> building ${config[*]:-(default config)}: ${targets[*]}"
bazel build ${config[@]+"${config[@]}"} --ui_event_filters=-info --noshow_progress "${targets[@]}"
bin_dir=$(bazel info ${config[@]+"${config[@]}"} bazel-bin 2>/dev/null)
binaries=("$bin_dir/chief/chief" "$bin_dir/ps_server/ps_server" "$bin_dir/worker/worker"
  "$bin_dir/evaluator/evaluator"
  "$bin_dir/bench/train_bench" "$bin_dir/bench/cluster_probe" "$bin_dir/bench/ps_bench"
  "$bin_dir/bench/sealed_channel_bench" "$bin_dir/bench/checkpoint_bench"
  "$bin_dir/bench/ctr_export" "$bin_dir/model/data/ctr_datagen")
# bench/gpu_ps.sh's loopback baseline: the GPU machine has no iperf3.
iperf3=$(command -v iperf3 || true)
if [[ -n $iperf3 ]]; then
  binaries+=("$iperf3")
else
  echo "gpu_prepare.sh: warning: no iperf3 here (apt-get install iperf3); the bundle's" \
    "bench/gpu_ps.sh will not run" >&2
fi
if bazel build ${config[@]+"${config[@]}"} --ui_event_filters=-info --noshow_progress \
  //cli:psctl; then
  binaries+=("$bin_dir/cli/psctl")
else
  echo "gpu_prepare.sh: warning: //cli:psctl does not build now; the bundle has no psctl" \
    "(gpu_train.sh does not need it)" >&2
fi
[[ $cuda -eq 1 ]] && binaries+=("$bin_dir/kernels/cuda_kernels_test"
  "$bin_dir/worker/cuda_trainer_test")
binaries+=(${extra[@]+"${extra[@]}"})
rm -rf "${out:?}"
"$bundler" "$out" "${binaries[@]}"
if [[ $cuda -eq 1 ]]; then
  # Another build in this workspace (without --config=cuda) may have replaced the outputs
  # between the build and the copy: the bundle's worker and train_bench must link cuBLAS.
  for b in worker train_bench; do
    # (ldd's whole output first: with pipefail, grep -q stopping early fails the pipe.)
    if ! grep -q libcublas <<<"$(ldd "$out/bin/$b" 2>/dev/null)"; then
      echo "gpu_prepare.sh: $out/bin/$b does not link cuBLAS (replaced by a CPU-only build" \
        "meanwhile?); run again" >&2
      exit 1
    fi
  done
fi
# Small enough to carry (the device tool takes at most 64 MiB with the tree, and the data alone
# is 30 MB): no debug symbols, and the binaries and libraries in one gzip'd tar, which
# gpu_train.sh unpacks into a temporary folder there.
chmod u+w "$out"/bin/* "$out"/lib/*
strip --strip-unneeded "$out"/bin/* "$out"/lib/* 2>/dev/null || true
tar -C "$out" -czf "$out/payload.tar.gz" run bin lib
rm -rf "${out:?}/run" "${out:?}/bin" "${out:?}/lib"

mkdir -p "$out/data" "$out/configs" "$out/bench" "$out/deploy/local"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
  t10k-labels-idx1-ubyte.gz; do
  cp "$data_dir/$f" "$out/data/"
done
cp configs/*.pbtxt "$out/configs/"
cp bench/gpu_train.sh bench/torch_mlp.py bench/torch_ddp_mlp.py bench/torch_cnn.py \
  bench/train_rate.py bench/train_cluster.sh bench/gpu_smoke.sh bench/gpu_tls.sh \
  bench/gpu_strongest.sh bench/gpu_tta.sh bench/gpu_ps.sh bench/ps.sh bench/gpu_ctr.sh \
  bench/torch_ctr.py "$out/bench/"
# Certificates for the TLS runs (bench/gpu_tls.sh; the GPU machine may have no openssl
# command; bench/gpu_ps.sh): one CA, chief-0, ps-0 to ps-3, worker-0 and worker-1 and
# psctl-viewer, all on 127.0.0.1.
mkdir -p "$out/deploy/tls"
cp deploy/tls/make_certs.sh "$out/deploy/tls/"
bash deploy/tls/make_certs.sh --out "$out/certs" --cluster gpu --chief_hosts 127.0.0.1:0 \
  --ps_hosts 127.0.0.1:0,127.0.0.1:0,127.0.0.1:0,127.0.0.1:0 --worker_hosts 127.0.0.1:0,127.0.0.1:0 \
  >/dev/null
# The main command, run there from the bundle's binaries:
#   bash DIR/deploy/local/run.sh --device gpu:0 --bin_dir BIN --data_path DIR/data
cp deploy/local/run.sh deploy/local/cluster.sh "$out/deploy/local/"
echo "==> $out: $(du -sh "$out" | cut -f1) (the device tool carries at most 64 MiB with the tree)"
echo "    on the GPU machine: bash $out/bench/gpu_train.sh   (device run, carry [\"$out\"])"
