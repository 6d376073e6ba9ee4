#!/usr/bin/python3
"""Scrapes a live local cluster with Debian's real Prometheus server.

A chief, 2 ps tasks and a worker train on 127.0.0.1 (async, a few thousand steps slowed down a
little so that the run lasts a while), each with --metrics_port=0. A Prometheus server
scrapes the four endpoints every second. Through its query API the test checks that every
target is up, that the series move while training runs (the global step, the worker's and the
ps tasks' counters, RPC counts and latency), that the ps and chief series are there with their
labels (apply time, variable bytes, table rows none for this model, the newest checkpoint's
age), and then that the run ends by itself with every task exiting 0.

Every panel of deploy/grafana's dashboard must be a query Prometheus accepts, over series the
run has.

usage: metrics_test.py BIN_DIR CONFIG_DIR WORK_DIR DASHBOARD_JSON
       (or through bazel test //tests:metrics_test)
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request


def listening_port(process, timeout=30):
    """The TCP port `process` listens on, read from /proc once it has bound it (it was told
    to bind port 0: no port is picked here and bound later by another process)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited {process.returncode} before listening")
        inodes = set()
        fd_dir = f"/proc/{process.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                # local_address is HEX_IP:HEX_PORT; state 0A is LISTEN; field 9 the inode.
                if fields[3] == "0A" and fields[9] in inodes:
                    return int(fields[1].split(":")[1], 16)
        time.sleep(0.05)
    raise RuntimeError(f"{process.args[0]} listens on no TCP port after {timeout} s")


def wait_for_file(path, process, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read().strip()
            if text:
                return int(text)
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited {process.returncode} before writing {path}")
        time.sleep(0.05)
    raise RuntimeError(f"no {path} after {timeout} s")


class Prometheus:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr):
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr}: {body}")
        return body["data"]["result"]

    def value(self, expr):
        """The single value of `expr` (sum it first for several series), or None."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def await_value(self, expr, predicate, timeout=60):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                last = self.value(expr)
                if last is not None and predicate(last):
                    return last
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{expr} = {last} after {timeout} s")


def main():
    bin_dir, config_dir, work, dashboard = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    procs = {}
    failures = []

    def start(name, binary, tf_config, *flags):
        log = open(os.path.join(work, f"{name}.log"), "w")
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config))
        procs[name] = subprocess.Popen(
            [os.path.join(bin_dir, binary), f"--metrics_port=0",
             f"--metrics_port_file={work}/{name}.metrics_port", *flags],
            env=env, stdout=log, stderr=subprocess.STDOUT)

    try:
        cluster = {"chief": ["127.0.0.1:0"], "ps": ["127.0.0.1:0", "127.0.0.1:0"],
                   "worker": ["127.0.0.1:0"]}
        start("chief", "chief/chief", {"cluster": cluster, "task": {"type": "chief", "index": 0}},
              f"--port_file={work}/chief.port",
              f"--model_config={config_dir}/softmax_regression.pbtxt", "--mode=async",
              "--max_train_examples=20000", "--max_test_examples=1000", "--epochs=2",
              "--batch_size=20", "--eval_every_secs=2", "--exit_after_training",
              f"--checkpoint_dir={work}/checkpoints", "--checkpoint_every_secs=2",
              "--replication=2")
        chief_port = wait_for_file(f"{work}/chief.port", procs["chief"])
        cluster["chief"] = [f"127.0.0.1:{chief_port}"]
        for i in range(2):
            start(f"ps{i}", "ps_server/ps_server",
                  {"cluster": cluster, "task": {"type": "ps", "index": i}},
                  f"--checkpoint_dir={work}/checkpoints")
        start("worker0", "worker/worker", {"cluster": cluster, "task": {"type": "worker", "index": 0}},
              "--step_delay_ms=8")
        targets = {n: wait_for_file(f"{work}/{n}.metrics_port", p) for n, p in procs.items()}

        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                    "scrape_configs:\n  - job_name: pscluster\n    static_configs:\n")
            for name, port in targets.items():
                f.write(f"      - targets: ['127.0.0.1:{port}']\n        labels: {{task: {name}}}\n")
        prom_log = open(os.path.join(work, "prometheus.log"), "w")
        procs["prometheus"] = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb",
             "--web.listen-address=127.0.0.1:0"],
            stdout=prom_log, stderr=subprocess.STDOUT)
        prom = Prometheus(listening_port(procs["prometheus"]))

        # Every target up.
        prom.await_value('count(up{job="pscluster"} == 1)', lambda v: v == len(targets))
        print(f"metrics_test: Prometheus scrapes {len(targets)} targets: {sorted(targets)}")

        # Series with their labels (while training runs: a target gone is no longer queried).
        present = [
            'pscluster_ps_variable_bytes{variable=~".+"}',
            'pscluster_chief_phase{phase="TRAINING"}',
            'pscluster_tasks{cluster_job="ps",health="HEALTH_SERVING"}',
            "pscluster_checkpoint_age_seconds",
            "pscluster_examples_per_second",
            'pscluster_ps_applies_total{kind="sparse"}',
            "pscluster_rpc_sent_bytes_total",
            # Replication 2: each ps task backs up the other's shards.
            'pscluster_ps_backup_shards{primary=~"ps:[01]",state="backup"}',
            "pscluster_ps_forwards_owed",
        ]
        for expr in present:
            prom.await_value(f"count({expr})", lambda v: v > 0, timeout=20)
        # Every panel of the Grafana dashboard is a query Prometheus accepts, over series this
        # run has (tables and sync drops exist only with tables and in sync mode).
        with open(dashboard) as f:
            panels = json.load(f)["panels"]
        only_sometimes = {"pscluster_ps_table_rows", "pscluster_ps_table_row_events_total",
                          "pscluster_ps_dropped_stale_gradients_total",
                          "pscluster_ps_table_groups_forwarded_total",
                          "pscluster_ps_table_groups_applied_total",
                          "pscluster_ps_shard_updates", "pscluster_ps_backup_shard_updates"}
        for panel in panels:
            expr = panel["targets"][0]["expr"]
            prom.query(expr)  # raises on a query Prometheus refuses
            for metric in set(re.findall(r"pscluster_[a-z_]+", expr)) - only_sometimes:
                metric = re.sub(r"_(bucket|count|sum)$", "", metric)
                if not prom.query(f'count({{__name__=~"{metric}(_bucket)?"}})'):
                    failures.append(f"dashboard panel {panel['title']!r}: no series {metric}")
        print(f"metrics_test: the {len(panels)} dashboard panels' queries run on the live series")
        served = prom.value('sum(pscluster_tasks{cluster_job="ps",health="HEALTH_SERVING"})')
        if served != 2:
            failures.append(f"pscluster_tasks says {served} ps tasks serving, expected 2")

        # The series move while training runs.
        moving = [
            ("pscluster_global_step", 'max(pscluster_global_step{task="chief"})'),
            ("pscluster_worker_steps_total", 'max(pscluster_worker_steps_total{task="worker0"})'),
            ("pscluster_ps_pushes_total", "sum(pscluster_ps_pushes_total)"),
            ("pscluster_ps_apply_seconds_total", 'sum(pscluster_ps_apply_seconds_total{kind="dense"})'),
            ("pscluster_ps_forwards_total", 'sum(pscluster_ps_forwards_total{outcome="acknowledged"})'),
            ("Heartbeat calls", 'sum(pscluster_rpc_requests_total{method="Coordinator.Heartbeat",code="OK"})'),
            ("ReportStep latency samples", 'sum(pscluster_rpc_duration_seconds_count{method="Coordinator.ReportStep"})'),
        ]
        first = {name: prom.await_value(expr, lambda v: v > 0) for name, expr in moving}
        for name, expr in moving:
            later = prom.await_value(expr, lambda v, f=first[name]: v > f, timeout=30)
            print(f"metrics_test: {name}: {first[name]:g} -> {later:g}")

        # The run ends by itself (--exit_after_training): every task exits 0.
        for name in ["chief", "ps0", "ps1", "worker0"]:
            try:
                code = procs[name].wait(timeout=240)
            except subprocess.TimeoutExpired:
                failures.append(f"{name} still running after 240 s")
                continue
            if code != 0:
                failures.append(f"{name} exited {code}")
        print("metrics_test: training ended and every task exited 0")
    except (AssertionError, RuntimeError, OSError) as e:
        failures.append(str(e))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    if failures:
        for name in ["chief", "ps0", "worker0", "prometheus"]:
            path = os.path.join(work, f"{name}.log")
            if os.path.exists(path):
                with open(path) as f:
                    print(f"--- {name} (last lines)\n" + "".join(f.readlines()[-15:]))
        for f in failures:
            print(f"FAIL {f}")
        return 1
    print("metrics_test: PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
