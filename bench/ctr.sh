#!/usr/bin/env bash
# CTR training throughput with embedding tables of millions of rows per ps task: wide & deep
# (configs/wide_deep.pbtxt's network) trained by a local cluster (deploy/local/run.sh: 2 ps,
# 2 workers, async, CPU) on synthetic Criteo-layout click logs whose categorical values are
# uniform over a large space, so that nearly every id is new and the tables grow to
# --rows_per_ps rows per ps task, where their capacity (eviction.max_rows) holds them.
# Admission is off here (uniform ids are seen about once: admission would keep them out).
#
# Prints the training throughput (examples/s, and keys/s: examples/s times the ids per example,
# each pulled and pushed, in each of the two tables), the rows each ps task holds at the end
# (psctl vars, live), and each ps task's peak resident memory per row against the rows' own
# floats and slots (and the worst of them against the rows' own bytes + 16: BENCH
# ctr_bytes_per_row), as `BENCH <name> <value> <unit>` lines. --keep keeps the run's folder
# (logs, checkpoints) instead of removing it.
#
#   bash bench/ctr.sh [--train_examples N] [--rows_per_ps N] [--ids_per_field N]
#                     [--batch_size N] [--epochs N] [--checkpoint_every_secs N]
#                     [--full_checkpoint_every N] [--zipf_exponent X] [--vs_no_checkpoints]
#                     [--keep]
#
# The chief checkpoints every --checkpoint_every_secs (default 60) and before the first step and
# at the end; the time the checkpoints held training and the time from their cuts to their
# commits are printed too. --vs_no_checkpoints runs the cluster a second time without periodic
# checkpoints (the first and the last are taken) and prints the ratio of the two throughputs
# (BENCH ctr_checkpointing_vs_not). --full_checkpoint_every N (the chief's flag; default 1: every
# checkpoint full) makes N - 1 incremental checkpoints after each full one; the mean size of the
# full and of the incremental checkpoints is printed (BENCH ctr_checkpoint_full_mib,
# ctr_checkpoint_delta_mib). --zipf_exponent X (default 0: uniform) skews the categorical values'
# popularity (ctr_datagen's flag, 1.05 there by default): pushes then come back to a working set,
# as in real click logs, and the tables change less between checkpoints.
#
# Defaults: 1,000,000 examples (26 ids each, 5 % missing: about 24.7 M ids, 12 M per ps task
# and table), a capacity of 10,000,000 rows per ps task and table, 10,000,000 values per field,
# batch 512, 1 epoch. About 4 minutes and 8 GiB of memory on 2 cores. Temporary files go under
# $TMPDIR (default /tmp) and are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

train_examples=1000000
rows_per_ps=10000000
ids_per_field=10000000
batch_size=512
epochs=1
keep=0
every=60
vs_none=0
full_every=1
zipf=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --train_examples) train_examples=$2; shift 2 ;;
    --rows_per_ps) rows_per_ps=$2; shift 2 ;;
    --ids_per_field) ids_per_field=$2; shift 2 ;;
    --batch_size) batch_size=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --checkpoint_every_secs) every=$2; shift 2 ;;
    --vs_no_checkpoints) vs_none=1; shift ;;
    --full_checkpoint_every) full_every=$2; shift 2 ;;
    --zipf_exponent) zipf=$2; shift 2 ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "ctr.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

bash tools/setup.sh >/dev/null
bazel build -c opt //model/data:ctr_datagen >/dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/ctr_bench.XXXXXX")
trap 'kill "$sampler" 2>/dev/null || true; if [[ $keep -eq 0 ]]; then rm -rf "$work"; else echo "kept $work"; fi' EXIT

echo "==> $train_examples training examples, 26 categorical columns of $ids_per_field values (zipf exponent $zipf)"
bazel-bin/model/data/ctr_datagen --train_out="$work/train.txt" --test_out="$work/test.txt" \
  --train_examples="$train_examples" --test_examples=20000 --ids_per_field="$ids_per_field" \
  --zipf_exponent="$zipf" | tee "$work/datagen.out"

# The network of configs/wide_deep.pbtxt; both tables capped at --rows_per_ps rows per ps task.
sed -e '/admission {/d' \
  -e "s/eviction { ttl_steps: 5000 max_rows: 5000000 }/eviction { max_rows: $rows_per_ps }/" \
  configs/wide_deep.pbtxt >"$work/model.pbtxt"
grep -q "max_rows: $rows_per_ps" "$work/model.pbtxt" || {
  echo "ctr.sh: configs/wide_deep.pbtxt no longer has the eviction line this script replaces" >&2
  exit 1
}

# One run of the cluster, its figures into $work/<label>.bench: every_secs is the chief's
# --checkpoint_every_secs (0: no periodic checkpoint; the one before the first step and the
# final one are taken either way).
run_once() {
  local label=$1 every_secs=$2
  local dir="$work/$label"
  mkdir -p "$dir"
  # Peak resident memory of each ps task of this run (their command lines name $dir).
  : >"$dir/rss"
  (
    while true; do
      for pid in $(pgrep -f "ps_server.*$dir" || true); do
        rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        idx=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | sed -nE 's/.*ps-([0-9]+)\.port.*/\1/p' || true)
        [[ -n $rss && -n $idx ]] && echo "$idx $rss" >>"$dir/rss"
      done
      sleep 1
    done
  ) &
  sampler=$!

  # The run, held up after training (--hold) so that its tables can be read live, with every line
  # stamped with the time it was printed: training runs from run.sh's "==> training" to its
  # "final test AUC" (which includes one evaluation of 20,000 examples).
  TMPDIR="$dir" bash deploy/local/run.sh --model "$work/model.pbtxt" --data criteo \
    --data_path "$work/train.txt" --test_data_path "$work/test.txt" --epochs "$epochs" \
    --batch_size "$batch_size" --ps 2 --workers 2 --hold -- --checkpoint_every_secs="$every_secs" --full_checkpoint_every="$full_every" \
    > >(while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done \
      >"$dir/run.out") 2>&1 &
  runner=$!  # run.sh itself, which stops its cluster on SIGTERM
  until grep -q "==> cluster up" "$dir/run.out" 2>/dev/null; do
    if ! kill -0 "$runner" 2>/dev/null; then
      echo "ctr.sh: the run ended before training did:" >&2
      tail -20 "$dir/run.out" >&2
      exit 1
    fi
    sleep 1
  done
  grep -E "==>|AUC" "$dir/run.out" | cut -d' ' -f2-
  kill "$sampler" 2>/dev/null || true
  chief=$(sed -nE 's/.*psctl --chief=([0-9.:]+) status.*/\1/p' "$dir/run.out" | head -1)
  "$(bazel info bazel-bin 2>/dev/null)/cli/psctl" --chief="$chief" --json vars >"$dir/vars.json"
  kill -TERM "$runner" 2>/dev/null || true
  wait "$runner" 2>/dev/null || true
  start=$(awk '/==> training/ {print $1; exit}' "$dir/run.out")
  end=$(awk '/final test AUC/ {print $1; exit}' "$dir/run.out")
  planted=$(sed -nE 's/.*planted_test_auc=([0-9.]+).*/\1/p' "$work/datagen.out")

  run_dir=$(find "$dir" -maxdepth 1 -name 'pscluster.*' | head -1)
  /usr/bin/python3 - "$run_dir/metrics.jsonl" "$dir/vars.json" "$dir/rss" "$train_examples" \
    "$epochs" "$start" "$end" "$planted" "$run_dir/chief-0.log" <<'EOF' | tee "$work/$label.bench"
import json, re, sys
metrics_path, vars_path, rss_path, examples, epochs, start, end, planted, chief_log = sys.argv[1:]
lines = [json.loads(l) for l in open(metrics_path) if l.strip()]
final = lines[-1]
seconds = float(end) - float(start)
rate = int(examples) * int(epochs) / seconds
report = json.load(open(vars_path))  # psctl --json vars: the live tables, part by ps task
rows = {}        # ps task -> rows over both tables
own_bytes = {}   # ps task -> the rows' values and slots, in bytes
for t in report["tables"]:
    slots = 2 if t["optimizer"].startswith("ftrl") else 1
    for p in t["parts"]:
        i = int(p.get("ps_task", 0))
        n = int(p.get("rows", 0))
        rows[i] = rows.get(i, 0) + n
        own_bytes[i] = own_bytes.get(i, 0) + n * (1 + slots) * int(t["dim"]) * 4
peak = {}
for line in open(rss_path):
    idx, kb = line.split()
    peak[int(idx)] = max(peak.get(int(idx), 0), int(kb) * 1024)
ids = 26 * 0.95  # categorical columns, 5 % empty (ctr_datagen --missing_rate)
print("BENCH ctr_examples_per_second %.0f examples/s" % rate)
print("BENCH ctr_keys_per_second %.2f Mkeys/s (ids per example x 2 tables, each pulled and pushed)"
      % (rate * ids * 2 * 2 / 1e6))
print("BENCH ctr_training_seconds %.1f s (%s examples x %s epochs; final step %d, test AUC "
      "%.4f, the planted model's %s)"
      % (seconds, examples, epochs, final["step"], final["test_auc"], planted))
# The chief's checkpoints: how long each held the workers, and how long it took to commit.
def seconds_of(d):  # absl::FormatDuration: "1m2.5s", "850.25ms", "40us"
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    return sum(float(v) * units[u] for v, u in re.findall(r"([0-9.]+)(h|ms|us|ns|m|s)", d))
held = took = 0.0
saves = 0
for line in open(chief_log, errors="replace"):
    m = re.search(r"the workers were held for (\S+) .*the save took (\S+)", line)
    if m:
        saves += 1
        held += seconds_of(m.group(1))
        took += seconds_of(m.group(2))
print("BENCH ctr_checkpoints_held_seconds %.2f s (training held by %d checkpoints; they took "
      "%.1f s from cut to commit)" % (held, saves, took))
# Their sizes, full and incremental, from the chief's "committed" lines (the one before the first
# step, of empty tables, left out).
sizes = {"full": [], "delta": []}
for line in open(chief_log, errors="replace"):
    m = re.search(r"checkpoint of step (\d+) committed \((.*)\): ([0-9.]+) MiB in ([0-9.]+) ms",
                  line)
    if m and int(m.group(1)) > 0:
        kind = "delta" if "(incremental, on " in line else "full"
        sizes[kind].append((float(m.group(3)), float(m.group(4))))
for kind, got in sizes.items():
    if got:
        print("BENCH ctr_checkpoint_%s_mib %.1f MiB (mean of %d %s checkpoints, %.1f s from cut to "
              "commit on average)" % (kind, sum(g[0] for g in got) / len(got), len(got),
                                      "full" if kind == "full" else "incremental",
                                      sum(g[1] for g in got) / len(got) / 1000))
for i in sorted(rows):
    print("BENCH ctr_rows_ps%d %d rows (both tables, at the end)" % (i, rows[i]))
    if i in peak and rows[i]:
        print("BENCH ctr_peak_rss_per_row_ps%d %.1f bytes ratio=%.3f (peak resident %.0f MiB; the "
              "rows' own values and slots: %.1f bytes a row)"
              % (i, peak[i] / rows[i], peak[i] / own_bytes[i], peak[i] / 2**20,
                 own_bytes[i] / rows[i]))
# Issue 36's measure: the worst ps task's peak resident bytes a row against the row's own bytes
# and 16 (an index entry).
measured = [(peak[i] / rows[i], i) for i in rows if i in peak and rows[i]]
if measured:
    per_row, i = max(measured)
    own = own_bytes[i] / rows[i]
    print("BENCH ctr_bytes_per_row %.1f bytes ratio=%.3f (ps %d's peak resident memory a row, "
          "against its rows' own %.1f bytes + 16)" % (per_row, per_row / (own + 16), i, own))
EOF
}

run_once with "$every"
if [[ $vs_none -eq 1 ]]; then
  run_once without 0
  with=$(awk '/^BENCH ctr_examples_per_second/ {print $3}' "$work/with.bench")
  without=$(awk '/^BENCH ctr_examples_per_second/ {print $3}' "$work/without.bench")
  awk -v a="$with" -v b="$without" -v e="$every" 'BEGIN { printf "BENCH ctr_checkpointing_vs_not %.3f x (%d examples/s with a checkpoint every %d s, %d without; same script, one run each)\n", a / b, a, e, b }'
fi
