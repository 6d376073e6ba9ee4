#!/usr/bin/env python3
"""Steady-state training rate of a live cluster, for bench/train.sh and bench/gpu_train.sh.

Two readings of the same window [t0, t1] (Unix seconds):

1. The workers' own logs. In async mode a worker logs `worker:I step S epoch E/N loss L` each
   time it reports to the chief (every 2 s), with glog's microsecond timestamp, and S is exact
   at that instant. A worker's rate is (S_last - S_first) / (t_last - t_first) over its lines
   inside the window.
2. Samples of the chief's ClusterStatus (bench/cluster_probe, the message `psctl status --json`
   prints) taken during the window: per worker, the delta of
   progress.worker_steps between the first and the last sample over their time apart. In sync
   mode a worker reports every step, so this is exact (and the workers log no periodic line);
   in async mode it is off by up to one report (2 s) at each end, so it is the cross-check.
   Also status_examples_per_second: delta progress.global_step * batch / delta time (times the
   number of workers in sync mode, where a global step is one step of every worker).

The primary reading is 1 in async mode and 2 in sync mode. The cluster's rate is the sum of the
workers' rates, each times its mean batch over an epoch (shard / ceil(shard / batch): an
epoch's last batch is short).

Prints one line of key=value pairs:
  RATE examples_per_second=X step_ms=X worker_steps=N,N source=logs|status
       status_examples_per_second=X window_s=X
       [cpu_ms_per_step_worker=X cpu_ms_per_step_ps=X cpu_ms_per_step_chief=X cores_busy=X
        other_cores_busy=X]
step_ms is the mean over workers of each worker's time per step; cpu_ms_per_step_ROLE is the
CPU time (user + system) all tasks of that role used in the window per worker step, and
cores_busy the CPU time of every task over the window, other_cores_busy that of every other
process of the machine (given --cpu0/--cpu1).
Uses only the standard library.
"""
import argparse
import datetime
import json
import math
import re
import sys

LINE = re.compile(
    r"^[IWEF](\d{4})?(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) .*\] worker:(\d+) step (\d+) "
)
SHARD = re.compile(r"worker:(\d+): (\d+) of (\d+) training examples are this worker's shard")


def glog_time(m, year):
    y = int(m.group(1)) if m.group(1) else year
    t = datetime.datetime(y, int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                          int(m.group(6)), int(m.group(7)))
    return t.timestamp()  # glog writes local time; so does timestamp() read it


def field(status, name):
    """progress.<name> of a ClusterStatus in JSON (proto names or lowerCamelCase); 0 if absent."""
    progress = status.get("progress", {})
    camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), name)
    return progress.get(name, progress.get(camel, 0))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--t1", type=float, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--sync", action="store_true", help="the cluster runs in sync mode")
    p.add_argument("--status_samples", default="",
                   help="file of lines `UNIX_SECONDS JSON` (ClusterStatus)")
    p.add_argument("--cpu0", default="", help="lines `job:index cpu_seconds` at t0")
    p.add_argument("--cpu1", default="", help="the same at t1")
    p.add_argument("logs", nargs="+", help="each worker's log")
    a = p.parse_args()
    year = datetime.datetime.now().year

    shards = {}

    def per_step(worker):
        shard = shards.get(worker)
        return shard / math.ceil(shard / a.batch) if shard else a.batch

    # ClusterStatus samples: (time, status) in time order.
    samples = []
    if a.status_samples:
        with open(a.status_samples) as f:
            for line in f:
                t, _, js = line.partition(" ")
                try:
                    samples.append((float(t), json.loads(js)))
                except ValueError:
                    continue

    # 1. The workers' progress lines (async: one per report, every 2 s).
    log_rates = []  # steps per second, per worker
    for w, path in enumerate(a.logs):
        points = []
        with open(path, errors="replace") as f:
            for line in f:
                s = SHARD.search(line)
                if s:
                    shards[w] = int(s.group(2))
                m = LINE.match(line)
                if m:
                    t = glog_time(m, year)
                    if a.t0 <= t <= a.t1:
                        points.append((t, int(m.group(9))))
        if len(points) >= 2 and points[-1][1] > points[0][1]:
            (ta, sa), (tb, sb) = points[0], points[-1]
            log_rates.append((sb - sa, (sb - sa) / (tb - ta)))
        else:
            log_rates.append(None)

    # 2. ClusterStatus: progress.worker_steps and global_step between the first and the last
    #    sample. Exact in sync mode (every step is reported at once); within a report (2 s) in
    #    async mode.
    status_rates, status_eps = [], float("nan")
    if len(samples) >= 2:
        (ta, ja), (tb, jb) = samples[0], samples[-1]
        wa, wb = field(ja, "worker_steps") or [], field(jb, "worker_steps") or []
        for w in range(len(a.logs)):
            if w < len(wa) and w < len(wb) and int(wb[w]) > int(wa[w]):
                d = int(wb[w]) - int(wa[w])
                status_rates.append((d, d / (tb - ta)))
            else:
                status_rates.append(None)
        ga, gb = int(field(ja, "global_step")), int(field(jb, "global_step"))
        per_global = len(a.logs) if a.sync else 1
        status_eps = (gb - ga) * per_global * a.batch / (tb - ta)

    # Sync mode workers log no periodic progress line (they report every step): the status is
    # exact there. Async: the logs are.
    rates = status_rates if a.sync else log_rates
    source = "status" if a.sync else "logs"
    if len(rates) != len(a.logs) or any(r is None for r in rates):
        print(f"train_rate.py: no progress of every worker in the window from the {source} "
              f"({rates}); are the workers training?", file=sys.stderr)
        return 1
    steps = [d for d, _ in rates]
    ex_rates = [r * per_step(w) for w, (_, r) in enumerate(rates)]
    step_ms = [1e3 / r for _, r in rates]

    # CPU time per worker step, by role (every worker's steps together), and cores busy.
    cpu = ""
    if a.cpu0 and a.cpu1:
        def read(path):
            with open(path) as f:
                return {k: float(v) for k, v in (l.split() for l in f if l.strip())}
        c0, c1 = read(a.cpu0), read(a.cpu1)
        total_rate = sum(r for _, r in rates)  # worker steps per second
        window = a.t1 - a.t0
        machine = c1.pop("machine", None), c0.pop("machine", None)
        by_role = {}
        for task in c1:
            by_role.setdefault(task.split(":")[0], 0.0)
            by_role[task.split(":")[0]] += c1[task] - c0.get(task, 0.0)
        for role in ("worker", "ps", "chief"):
            if role in by_role:
                per_step_ms = 1e3 * by_role[role] / window / total_rate
                cpu += " cpu_ms_per_step_%s=%.3f" % (role, per_step_ms)
        ours = sum(by_role.values()) / window
        cpu += " cores_busy=%.2f" % ours
        if None not in machine:
            # Other processes of the machine over the window (builds, tests of other sessions):
            # what they took, the cluster could not use.
            cpu += " other_cores_busy=%.2f" % max(0.0, (machine[0] - machine[1]) / window - ours)

    print("RATE examples_per_second=%.1f step_ms=%.4f worker_steps=%s source=%s "
          "status_examples_per_second=%.1f window_s=%.1f%s" %
          (sum(ex_rates), sum(step_ms) / len(step_ms), ",".join(map(str, steps)), source,
           status_eps, a.t1 - a.t0, cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
