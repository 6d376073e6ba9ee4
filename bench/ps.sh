#!/usr/bin/env bash
# Benchmarks the parameter servers on 127.0.0.1, from a fresh clone, in one run:
#   1. loopback TCP bandwidth: iperf3, one stream, median of 3 x 3 s, at the start and again
#      before each configuration (the throughput baseline: for each configuration's ratios, the
#      higher of the two), and the round trip of 4 bytes over loopback TCP (the latency
#      baseline, from ps_bench);
#   2. for 1 ps + 1 worker and 2 ps + 2 workers: a chief and the ps tasks as real processes,
#      then ps_bench: dense push/pull of 4 B, 4 KiB, 1 MiB, 16 MiB, 64 MiB variables (SGD) and
#      sparse push/pull of 100,000 keys x 8 floats (Adagrad; a plain table, one with
#      admission and eviction, and a vocabulary table of ids in [0, key space)), throughput and
#      p50/p99 latency,
#      each also as a ratio to the loopback figure.
# Prints each run's table, then every figure as `BENCH <name> <value> <unit> ratio=<r>` and
# a markdown summary. Takes about 3 minutes after the build on 2 cores.
#
#   bash bench/ps.sh [--min_seconds S] [--repeats N] [--chunk_bytes B]
#                    [--pull_chunk_bytes B] [--configs "1x1 2x2"] [--transports "tensor_wire"]
#                    [--only d_1MiB,emb] [--sparse_key_space N] [--ps_binary PATH]
#                    [--bench_binary PATH] [--tls] [--kernel_tls] [--replication]
#                    [--keep_logs] [--bin_dir DIR] [--certs DIR]
#
# Each figure is measured --repeats times (default 3), each trial at least --min_seconds
# (default 1.5): throughput is the median trial's, latency percentiles pool every trial.
# --transports lists how the clients pull and push: tensor_wire (the ps tasks' TCP data plane,
# what workers use) and/or grpc; each is a run of its own with its own figures (names end in
# _grpc for gRPC). --chunk_bytes is the gRPC client's chunk size for streamed dense pushes and
# pulls (it also sets the ps's gRPC pull chunks); --pull_chunk_bytes is the ps_server flag.
# --configs lists PSxWORKERS runs; --only measures those variables and tables alone.
# --sparse_key_space draws the sparse keys from N keys instead of 1,000,000 (all created in the
# warm-up): a larger table, whose rows and index entries miss the caches and the TLB more.
# Every figure also gets the CPU seconds the clients and the ps tasks spent per GB moved.
# --ps_binary runs that ps_server instead of the one just built: copy a build aside, change the
# code, and run the script once with each to compare them on the same machine and day.
# --bench_binary does the same for the client side (bench/ps_bench, with its ParameterClient).
# --tls measures every configuration twice in the same run, plaintext and with mutual TLS on
# both planes as a deployed cluster runs (certificates from deploy/tls/make_certs.sh; each
# client is a worker with its own certificate); TLS figures' names end in _tls, and each
# also gets `BENCH tls_<figure> <value> <unit> ratio=<TLS / plaintext>`. --kernel_tls has the
# data plane use TLS records, encrypted by the kernel (kTLS) where it has it (the ps log says
# which), instead of sealed chunks (common/sealed_channel.h).
# --replication measures every configuration of 2 ps tasks or more twice in the same run: as
# the chief creates it, and with every dense partition and table row backed up on another ps
# task, each push forwarded there before it is answered (issue 37, docs/replication.md);
# replicated figures' names end in _r2, and each also gets `BENCH replicated_<figure> <value>
# <unit> ratio=<R = 2 / R = 1>`. With --tls too, both are measured in both modes (the
# forwards then go over the backups' data plane with TLS): replicated_<figure>_tls is R = 2 /
# R = 1 with TLS, tls_<figure>_r2 TLS / plaintext at R = 2.
# --bin_dir runs the chief, ps_server and ps_bench found in DIR instead of building them (on
# a machine without Bazel: bench/gpu_ps.sh runs this script from the GPU machine's bundle);
# --certs DIR gives --tls the certificates of DIR (deploy/tls/make_certs.sh's, with chief-0,
# ps-<i> and worker-<w>) instead of making them with the openssl command.
# Before each run the script waits (up to 60 s) for the machine to be quiet (under 10% busy)
# and says so when it was not. Temporary files go under $TMPDIR (default /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."

min_seconds=1.5
repeats=3
chunk_bytes=$((1 << 20))
pull_chunk_bytes=""
configs="1x1 2x2"
transports="tensor_wire"
only=""
sparse_key_space=""
keep_logs=0
tls_modes="plain"
replications="1"
kernel_tls=0
ps_binary=""
bench_binary=""
prebuilt_dir=""
certs_dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --min_seconds) min_seconds=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --chunk_bytes) chunk_bytes=$2; shift 2 ;;
    --pull_chunk_bytes) pull_chunk_bytes=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --transports) transports=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --sparse_key_space) sparse_key_space=$2; shift 2 ;;
    --ps_binary) ps_binary=$2; shift 2 ;;
    --bench_binary) bench_binary=$2; shift 2 ;;
    --keep_logs) keep_logs=1; shift ;;
    --bin_dir) prebuilt_dir=$2; shift 2 ;;
    --certs) certs_dir=$2; shift 2 ;;
    --tls) tls_modes="plain tls"; shift ;;
    --kernel_tls) kernel_tls=1; shift ;;
    --replication) replications="1 2"; shift ;;
    -h|--help) sed -n '2,51p' "$0"; exit 0 ;;
    *) echo "ps.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z $prebuilt_dir ]]; then
  bash tools/setup.sh >/dev/null
  echo "==> building -c opt: chief, ps_server, ps_bench"
  # A strict action environment: a shell with another PATH does not rebuild everything.
  build_flags=(-c opt --incompatible_strict_action_env)
  bazel build "${build_flags[@]}" --ui_event_filters=-info --noshow_progress //chief //ps_server \
    //bench:ps_bench
  bin_dir=$(bazel info "${build_flags[@]}" bazel-bin 2>/dev/null)
  built=(chief/chief ps_server/ps_server bench/ps_bench)
else
  echo "==> chief, ps_server and ps_bench from $prebuilt_dir (--bin_dir), not built"
  bin_dir=$prebuilt_dir
  built=(chief ps_server ps_bench)
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ps_bench.XXXXXX")
echo "==> logs in $work"
# Private copies: another build in this workspace may replace the outputs mid-run.
for b in "${built[@]}"; do
  cp "$bin_dir/$b" "$work/$(basename "$b")"
done
if [[ -n "$ps_binary" ]]; then
  echo "==> ps_server: $ps_binary (--ps_binary), not the one built"
  cp "$ps_binary" "$work/ps_server"
fi
if [[ -n "$bench_binary" ]]; then
  echo "==> ps_bench: $bench_binary (--bench_binary), not the one built"
  cp "$bench_binary" "$work/ps_bench"
fi

# Starting, stopping and TF_CONFIG: the launcher every script of the repository shares. The
# benchmark's clients are no cluster tasks, so the worker job is empty.
# shellcheck source=deploy/local/cluster.sh
source deploy/local/cluster.sh
launch() { exec "$work/$1" "${@:2}"; }
iperf_pid=""

cleanup() {
  local rc=$?
  if [[ -n $iperf_pid ]]; then kill "$iperf_pid" 2>/dev/null || true; wait "$iperf_pid" 2>/dev/null || true; fi
  if [[ ${#cl_pids[@]} -gt 0 ]]; then cl_stop quiet || true; fi
  if [[ $rc -eq 0 && $keep_logs -eq 0 ]]; then
    rm -rf "$work"
  else
    echo "==> logs kept in $work"
  fi
}
trap cleanup EXIT
trap 'echo; echo "ps.sh: interrupted" >&2; exit 130' INT TERM

# Percent of CPU time used over 2 s by anything (this script's daemons are idle then): other
# work on the machine lowers every figure, so each run reports it.
cpu_busy_percent() {
  local a b c d e f g t1 i1 t2 i2
  read -r _ a b c d e f g _ </proc/stat; t1=$((a + b + c + d + e + f + g)); i1=$((d + e))
  sleep 2
  read -r _ a b c d e f g _ </proc/stat; t2=$((a + b + c + d + e + f + g)); i2=$((d + e))
  echo $((100 - 100 * (i2 - i1) / (t2 - t1)))
}

# Waits up to 60 s for the machine to be under 10% busy; says how busy it stayed otherwise.
await_quiet() {
  local busy i
  for i in $(seq 30); do
    busy=$(cpu_busy_percent)
    if [[ $busy -lt 10 ]]; then
      echo "    machine quiet: ${busy}% busy"
      return 0
    fi
  done
  echo "    WARNING: the machine stayed ${busy}% busy for 60 s; the figures below are low" >&2
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

echo "==> machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); CPU busy before the run: $(cpu_busy_percent)%"
# Sets measured_gbps to the median of three 3-second iperf3 runs over 127.0.0.1, in GB/s (the
# runs on stderr). Not called in a subshell, so that cleanup sees the iperf3 server's pid.
measure_loopback() {
  local port listen_entry i
  port=$(free_port)
  iperf3 -s -B 127.0.0.1 -p "$port" >"$work/iperf3-server.log" 2>&1 &
  iperf_pid=$!
  # Listening yet? (/proc/net/tcp: 127.0.0.1:port, state 0A = LISTEN.)
  listen_entry="0100007F:$(printf '%04X' "$port") 00000000:0000 0A"
  for _ in $(seq 100); do grep -q "$listen_entry" /proc/net/tcp && break; sleep 0.05; done
  # iperf3 3.12 exits 0 even when it cannot connect; the JSON says whether it measured.
  for i in 1 2 3; do
    iperf3 -c 127.0.0.1 -p "$port" -t 3 -P 1 -J >"$work/iperf3-$i.json" 2>>"$work/iperf3-client.log" || true
  done
  kill "$iperf_pid" 2>/dev/null || true
  wait "$iperf_pid" 2>/dev/null || true
  iperf_pid=""
  if ! measured_gbps=$(python3 -c '
import json, sys
rates = []
for path in sys.argv[1:]:
    r = json.load(open(path))
    if r.get("error"):
        sys.exit("iperf3: %s (%s)" % (r["error"], path))
    rates.append(r["end"]["sum_received"]["bits_per_second"] / 8e9)
print("    runs (GB/s): " + " ".join("%.3f" % x for x in rates), file=sys.stderr)
print("%.3f" % sorted(rates)[len(rates) // 2])
' "$work"/iperf3-{1,2,3}.json); then
    echo "ps.sh: iperf3 did not measure; see $work/iperf3-*.json" >&2
    return 1
  fi
}

echo "==> loopback TCP bandwidth: iperf3, 1 stream, 3 x 3 s, 127.0.0.1"
measure_loopback || exit 1
loopback_gbps=$measured_gbps
echo "    median $loopback_gbps GB/s"

echo "==> loopback TCP round trip of 4 bytes (ps_bench --loopback_rtt_only)"
"$work/ps_bench" --loopback_rtt_only | tee "$work/rtt.out"
loopback_rtt_us=$(awk '$2 == "loopback_rtt_4B_p50" {print $3}' "$work/rtt.out")

{
  echo "BENCH loopback_iperf3_1stream $loopback_gbps GB/s ratio=1.00"
  grep '^BENCH ' "$work/rtt.out"
} >"$work/bench.txt"

# The model: SGD dense variables of 4 B to 64 MiB (rows of 4 KiB, so that they can be split
# along the first dimension) and three 8-float Adagrad embedding tables: a hashed one; one
# with admission (a row at a key's second push) and eviction (a TTL and a capacity that the
# benchmark never reaches, so that it measures the bookkeeping; docs/embeddings.md); and a
# vocabulary table of the key space's ids (rows found by number, no index).
cat >"$work/model.pbtxt" <<'EOF'
variables { name: "d_4B" shape { dims: 1 } dtype: DT_FLOAT32
  initializer { kind: ZEROS } optimizer { sgd { learning_rate: 0.01 } } }
variables { name: "d_4KiB" shape { dims: 1024 } dtype: DT_FLOAT32
  initializer { kind: ZEROS } optimizer { sgd { learning_rate: 0.01 } } }
variables { name: "d_1MiB" shape { dims: 256 dims: 1024 } dtype: DT_FLOAT32
  initializer { kind: ZEROS } optimizer { sgd { learning_rate: 0.01 } } }
variables { name: "d_16MiB" shape { dims: 4096 dims: 1024 } dtype: DT_FLOAT32
  initializer { kind: ZEROS } optimizer { sgd { learning_rate: 0.01 } } }
variables { name: "d_64MiB" shape { dims: 16384 dims: 1024 } dtype: DT_FLOAT32
  initializer { kind: ZEROS } optimizer { sgd { learning_rate: 0.01 } } }
tables { name: "emb" dim: 8
  initializer { kind: UNIFORM min: -0.05 max: 0.05 seed: 7 }
  optimizer { adagrad { learning_rate: 0.05 initial_accumulator_value: 0.1 } } }
tables { name: "emb_managed" dim: 8
  initializer { kind: UNIFORM min: -0.05 max: 0.05 seed: 7 }
  optimizer { adagrad { learning_rate: 0.05 initial_accumulator_value: 0.1 } }
  admission { min_count: 2 sketch_width: 4194304 }
  eviction { ttl_steps: 1000000 max_rows: 4000000 } }
tables { name: "emb_vocab" dim: 8
  initializer { kind: UNIFORM min: -0.05 max: 0.05 seed: 7 }
  optimizer { adagrad { learning_rate: 0.05 initial_accumulator_value: 0.1 } }
EOF
echo "  vocabulary_size: ${sparse_key_space:-1000000} }" >>"$work/model.pbtxt"

ps_flags=()
if [[ -n $pull_chunk_bytes ]]; then ps_flags+=(--pull_chunk_bytes="$pull_chunk_bytes"); fi

# --tls: one CA and a certificate per task (every task binds 127.0.0.1, which they name) and
# per benchmark client (worker-<w>), for the largest configuration.
if [[ $tls_modes == *tls* ]]; then
  max_ps=1 max_workers=1
  for config in $configs; do
    [[ ${config%x*} -gt $max_ps ]] && max_ps=${config%x*}
    [[ ${config#*x} -gt $max_workers ]] && max_workers=${config#*x}
  done
  hosts() { local out="" i; for ((i = 0; i < $1; i++)); do out+="${out:+,}127.0.0.1:0"; done; echo "$out"; }
  if [[ -n $certs_dir ]]; then
    cp -r "$certs_dir" "$work/certs"
    chmod -R u+rwX,go-rwx "$work/certs"
    for holder in chief-0 "ps-$((max_ps - 1))" "worker-$((max_workers - 1))"; do
      [[ -f $work/certs/$holder.pem ]] ||
        { echo "ps.sh: --certs $certs_dir has no $holder.pem" >&2; exit 2; }
    done
  else
    bash deploy/tls/make_certs.sh --out "$work/certs" --cluster bench --chief_hosts 127.0.0.1:0 \
      --ps_hosts "$(hosts "$max_ps")" --worker_hosts "$(hosts "$max_workers")" >/dev/null
  fi
  echo "==> --tls: certificates in $work/certs"
fi

for tls_mode in $tls_modes; do
for transport in $transports; do
for config in $configs; do
for replication in $replications; do
  num_ps=${config%x*}
  num_workers=${config#*x}
  if [[ $replication -gt 1 && $num_ps -lt 2 ]]; then continue; fi
  tag="${num_ps}ps${num_workers}w"
  [[ $transport == grpc ]] && tag="${tag}_grpc"
  [[ $replication -gt 1 ]] && tag="${tag}_r${replication}"
  cl_tls_dir="" bench_tls=() ps_tls=()
  if [[ $tls_mode == tls ]]; then
    tag="${tag}_tls"
    cl_tls_dir="$work/certs"  # each task its own certificate
    bench_tls=(--tls_dir="$work/certs")
    [[ $kernel_tls -eq 1 ]] && bench_tls+=(--kernel_tls) && ps_tls+=(--data_plane_kernel_tls)
  fi
  cl_dir="$work/$tag"
  mkdir -p "$cl_dir"
  # With more than one ps, partitions of at most 8 MiB split the 16 MiB variable in 2 and the
  # 64 MiB one in 8; round-robin placement then gives every ps a share of both.
  max_partition_bytes=0
  if [[ $num_ps -gt 1 ]]; then max_partition_bytes=$((8 << 20)); fi
  echo "==> $tag: 1 chief, $num_ps ps (max_partition_bytes=$max_partition_bytes), $num_workers client(s)"
  cl_start_task chief chief 0 "127.0.0.1:0" "$num_ps" 0 \
    --model_spec="$work/model.pbtxt" --max_partition_bytes="$max_partition_bytes" || exit 1
  chief=$(cl_chief_address)
  for ((i = 0; i < num_ps; i++)); do
    cl_start_task ps_server ps "$i" "$chief" "$num_ps" 0 ${ps_flags[@]+"${ps_flags[@]}"} \
      ${ps_tls[@]+"${ps_tls[@]}"} || exit 1
  done
  await_quiet
  # This machine's loopback moves with other tenants' load (1.5 to 3.3 GB/s within an hour),
  # and such load only ever slows it: each configuration measures it again, with its daemons
  # idle, and its ratios use the higher of that and the run's first figure, the figure nearer
  # the machine's capacity (so a slow first measure cannot inflate them).
  measure_loopback || exit 1
  config_gbps=$measured_gbps
  baseline_gbps=$(python3 -c 'import sys; print("%.3f" % max(map(float, sys.argv[1:])))' \
    "$loopback_gbps" "$config_gbps")
  echo "    $tag: iperf3 $config_gbps GB/s now; the baseline for its ratios: $baseline_gbps GB/s"
  echo "BENCH loopback_iperf3_1stream_$tag $baseline_gbps GB/s ratio=1.00" >>"$work/bench.txt"
  ps_pids=$(IFS=,; echo "${cl_pids[*]:1}")
  # ps_bench waits for the model (GetModel with wait_until_ready) before it measures.
  "$work/ps_bench" --chief="$chief" --workers="$num_workers" --tag="$tag" \
    --transport="$transport" --ps_pids="$ps_pids" --only="$only" \
    --loopback_gbps="$baseline_gbps" --loopback_rtt_us="$loopback_rtt_us" \
    --min_seconds="$min_seconds" --repeats="$repeats" --chunk_bytes="$chunk_bytes" \
    --replication="$replication" \
    ${sparse_key_space:+--sparse_key_space="$sparse_key_space"} \
    ${bench_tls[@]+"${bench_tls[@]}"} 2>&1 | tee "$work/$tag.out"
  grep '^BENCH ' "$work/$tag.out" >>"$work/bench.txt"
  echo "==> $tag: stopping the daemons (SIGTERM)"
  cl_stop || exit 1
done
done
done
done

# Each figure whose name has `suffix` (_r2, _tls) against the same figure without it, from this
# run: `BENCH <prefix>_<figure> <value> <unit> ratio=<with / without>`.
same_run_ratios() {
  python3 - "$work/bench.txt" "$1" "$2" >>"$work/bench.txt" <<'PY'
import sys
path, suffix, prefix = sys.argv[1:4]
figures = {}
for line in open(path):
    _, name, value, unit, _ = line.split()
    figures[name] = (float(value), unit)
for name, (value, unit) in figures.items():
    # (Not the ratios of an earlier pass: replicated_<figure>_tls is not a TLS figure.)
    if suffix not in name or name.startswith(("loopback", "replicated_", "tls_")):
        continue
    plain = name.replace(suffix, "", 1)
    if plain not in figures or figures[plain][0] == 0:
        continue
    print("BENCH %s_%s %g %s ratio=%.2f" % (prefix, plain, value, unit, value / figures[plain][0]))
PY
}
# --replication: each replicated figure against the same figure unreplicated.
if [[ $replications == *2* ]]; then same_run_ratios _r2 replicated; fi
# --tls: each TLS figure against the same figure in plaintext.
if [[ $tls_modes == *tls* ]]; then same_run_ratios _tls tls; fi

echo
echo "==> every figure (ratio = value / loopback figure of this run: iperf3 GB/s for"
echo "    throughput, sparse as MB/s of rows; the 4-byte TCP round trip p50 for latency)"
cat "$work/bench.txt"

echo
echo "==> summary (markdown)"
python3 - "$work/bench.txt" "$configs" "$transports" "$tls_modes" <<'EOF'
import re, sys

figures = {}
for line in open(sys.argv[1]):
    _, name, value, unit, ratio = line.split()
    figures[name] = (value, unit, ratio.split("=", 1)[1])
tags = []
for mode in sys.argv[4].split():
    for t in sys.argv[3].split():
        tags += ["%sps%sw%s%s" % (*c.split("x"), "_grpc" if t == "grpc" else "",
                                  "_tls" if mode == "tls" else "")
                 for c in sys.argv[2].split()]

def cell(name):
    if name not in figures:
        return "-"
    value, unit, ratio = figures[name]
    return "%s %s (%s)" % (value, unit, ratio) if ratio != "n/a" else "%s %s" % (value, unit)

print("loopback: iperf3 %s GB/s at the start (%s), TCP round trip p50 %s us\n" % (
    figures["loopback_iperf3_1stream"][0],
    ", ".join("%s's ratios against %s GB/s" % (t, figures["loopback_iperf3_1stream_" + t][0])
              for t in tags if "loopback_iperf3_1stream_" + t in figures),
    figures["loopback_rtt_4B_p50"][0]))
header = ["figure"]
for t in tags:
    header += [t + " throughput (x loopback)", t + " p50 us (x rtt)", t + " p99 us",
               t + " CPU s/GB client / ps"]
print("| " + " | ".join(header) + " |")
print("|" + "---|" * len(header))
rows = []
for name in figures:
    # A figure's base name may hold its table's name (sparse_push_emb_managed_100kx8).
    m = re.match(r"((dense|sparse)_(push|pull)_(.+))_%s$" % re.escape(tags[0]), name)
    if m and not re.search(r"_(p50|p99|keys)$", m.group(1)):
        rows.append(m.group(1))
for base in rows:
    line = [base]
    for t in tags:
        line += [cell("%s_%s" % (base, t)), cell("%s_p50_%s" % (base, t)),
                 figures.get("%s_p99_%s" % (base, t), ("-",))[0],
                 "%s / %s" % (figures.get("%s_cpu_%s_client" % (base, t), ("-",))[0],
                              figures.get("%s_cpu_%s_ps" % (base, t), ("-",))[0])]
        if base.startswith("sparse"):
            line[-4] += " = " + cell("%s_keys_%s" % (base, t))
    print("| " + " | ".join(line) + " |")
EOF
