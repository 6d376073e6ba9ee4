#!/usr/bin/python3
"""Checks the Kubernetes manifests as CI can without a cluster.

For every overlay under deploy/kubernetes/overlays:
  1. it renders (`kubectl kustomize`);
  2. every rendered object passes a schema check that rejects unknown fields and wrong scalar
     types, against the API types of Debian's python3-kubernetes (Kubernetes 1.22 objects) and
     the newer JobSpec fields described in NEWER_FIELDS, and deserializes with its required
     fields; every Job fails at once on exit code 2, ignores disruptions, has a deadline and
     evicts from a lost node within 60 s;
  3. the cluster holds together: the headless Service publishes not-ready addresses and
     selects every task's pod; each Job is an Indexed Job named <service>-<job> with the
     Service as subdomain; running entrypoint.sh in each simulated pod (its rendered
     environment and ConfigMap, its host name and completion index) gives a TF_CONFIG whose
     every address is a pod of the rendered Jobs at <pod>.<service>:<port>, and probes that
     dial the pod's own port with its own DNS name; the NetworkPolicy, Secret, volume and
     ConfigMap references match; the metrics port (METRICS_PORT) is the pods' annotated,
     declared and admitted one, and the daemons get it; pods run non-root, read-only, without
     capabilities or a service-account token; ps tasks get guaranteed QoS.
Also: entrypoint.sh refuses a broken pod environment with a message naming what is wrong, and
base/model.pbtxt is configs/mlp.pbtxt.

usage: check_manifests.py REPO_ROOT   (exit 0: all good; 1: the failures are listed)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml
from kubernetes import client as k8s

FAILURES = []


def fail(where, message):
    FAILURES.append(f"{where}: {message}")


# apiVersion/kind -> the python3-kubernetes model class name.
MODELS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Secret"): "V1Secret",
    ("batch/v1", "Job"): "V1Job",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
}

SCALARS = {"str": str, "int": int, "bool": bool, "float": (int, float)}

# Fields newer than python3-kubernetes 22.6 (Kubernetes 1.22) that the Jobs use, as the
# Kubernetes API documents them (batch/v1 JobSpec, 1.26+): model name -> {field: type}, checked
# as the library's models are. Types starting with "New" are described here, not in the
# library.
NEWER_FIELDS = {
    "V1JobSpec": {"podFailurePolicy": "NewPodFailurePolicy", "podReplacementPolicy": "str",
                  "backoffLimitPerIndex": "int", "maxFailedIndexes": "int"},
}
NEW_MODELS = {
    "NewPodFailurePolicy": {"rules": "list[NewPodFailurePolicyRule]"},
    "NewPodFailurePolicyRule": {"action": "str", "onExitCodes": "NewOnExitCodes",
                                "onPodConditions": "list[NewOnPodCondition]"},
    "NewOnExitCodes": {"containerName": "str", "operator": "str", "values": "list[int]"},
    "NewOnPodCondition": {"type": "str", "status": "str"},
}
NEW_ENUMS = {("NewPodFailurePolicyRule", "action"): {"FailJob", "FailIndex", "Ignore", "Count"},
             ("NewOnExitCodes", "operator"): {"In", "NotIn"},
             ("V1JobSpec", "podReplacementPolicy"): {"TerminatingOrFailed", "Failed"}}


def check_value(where, value, type_name):
    """Checks `value` against an openapi type name of the python client."""
    if type_name == "object":  # IntOrString, Quantity with a number, raw extensions
        if not isinstance(value, (str, int, float, dict, list)):
            fail(where, f"unexpected {type(value).__name__}")
        return
    if type_name in SCALARS:
        expected = SCALARS[type_name]
        if isinstance(value, bool) and type_name != "bool":
            fail(where, f"is a boolean, expected {type_name}")
        elif not isinstance(value, expected):
            fail(where, f"is {type(value).__name__} {value!r}, expected {type_name}")
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            fail(where, f"is {type(value).__name__}, expected a list")
            return
        for i, item in enumerate(value):
            check_value(f"{where}[{i}]", item, type_name[5:-1])
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            fail(where, f"is {type(value).__name__}, expected a map")
            return
        item_type = type_name[5:-1].split(", ", 1)[1]
        for key, item in value.items():
            check_value(f"{where}.{key}", item, item_type)
        return
    if type_name in NEW_MODELS:
        fields = NEW_MODELS[type_name]
    else:
        model = getattr(k8s, type_name, None)
        if model is None:
            fail(where, f"no model {type_name} in python3-kubernetes")
            return
        fields = {json_name: model.openapi_types[py]
                  for py, json_name in model.attribute_map.items()}
        fields.update(NEWER_FIELDS.get(type_name, {}))
    if not isinstance(value, dict):
        fail(where, f"is {type(value).__name__}, expected an object ({type_name})")
        return
    for key, item in value.items():
        if key not in fields:
            fail(where, f"unknown field \"{key}\" in {type_name}")
            continue
        allowed = NEW_ENUMS.get((type_name, key))
        if allowed is not None and item not in allowed:
            fail(f"{where}.{key}", f"is {item!r}, expected one of {sorted(allowed)}")
        check_value(f"{where}.{key}", item, fields[key])


def check_schema(where, obj):
    model = MODELS.get((obj.get("apiVersion"), obj.get("kind")))
    if model is None:
        fail(where, f"apiVersion {obj.get('apiVersion')} kind {obj.get('kind')} is not checked here")
        return
    check_value(where, obj, model)
    # Deserializing checks each model's required fields (it raises on a missing one).
    api = k8s.ApiClient()
    try:
        api._ApiClient__deserialize(obj, model)  # pylint: disable=protected-access
    except (ValueError, TypeError) as e:
        fail(where, f"does not deserialize as {model}: {e}")


def render(overlay):
    result = subprocess.run(["kubectl", "kustomize", overlay], capture_output=True, text=True)
    if result.returncode != 0 and 'unknown field "components"' in result.stderr:
        fail(overlay, "kubectl's kustomize is too old for kustomize components (v3.7+, kubectl "
             ">= 1.21; Debian 12's kubernetes-client is 1.20): install a newer kubectl")
        return []
    if result.returncode != 0:
        fail(overlay, f"kubectl kustomize failed: {result.stderr.strip()}")
        return []
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def dry_run(entrypoint, env, args):
    """Runs entrypoint.sh with PSCLUSTER_DRY_RUN=1 in `env`; returns (code, stdout, stderr)."""
    full = {"PATH": "/usr/bin:/bin", "PSCLUSTER_DRY_RUN": "1"}
    full.update(env)
    result = subprocess.run(["/bin/sh", entrypoint] + args, env=full, capture_output=True,
                            text=True)
    return result.returncode, result.stdout, result.stderr


def pod_env(where, container, config_maps):
    """The environment a container gets from its env and envFrom ConfigMaps."""
    env = {}
    for source in container.get("envFrom", []):
        name = source.get("configMapRef", {}).get("name")
        if name not in config_maps:
            fail(where, f"envFrom names ConfigMap {name}, which is not rendered")
            continue
        env.update(config_maps[name].get("data", {}))
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
    return env


def check_pod_security(where, pod, container):
    if pod.get("automountServiceAccountToken") is not False:
        fail(where, "the service-account token is mounted")
    sc = pod.get("securityContext", {})
    if sc.get("runAsNonRoot") is not True or not sc.get("runAsUser"):
        fail(where, "pods must run as a non-root user")
    if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        fail(where, "seccomp profile is not RuntimeDefault")
    csc = container.get("securityContext", {})
    if csc.get("readOnlyRootFilesystem") is not True:
        fail(where, "the root filesystem is writable")
    if csc.get("allowPrivilegeEscalation") is not False:
        fail(where, "privilege escalation is allowed")
    if csc.get("capabilities", {}).get("drop") != ["ALL"]:
        fail(where, "capabilities are not all dropped")


def failure_policy_problems(job):
    """What lets a Job retry a permanent error or count an eviction as a failure, as (where,
    message): its pods restart as new pods (restartPolicy Never, which podFailurePolicy needs),
    exit code 2 (a refused flag, config or environment: the entrypoint's and the daemons'
    code for bad input) fails the Job at once, a disruption (eviction, preemption, a node
    drained) is not counted against backoffLimit, and the Job has a deadline."""
    where = f"Job/{job['metadata']['name']}"
    spec = job["spec"]
    problems = []
    if spec["template"]["spec"].get("restartPolicy") != "Never":
        problems.append((where, "restartPolicy is not Never (podFailurePolicy needs it)"))
    rules = spec.get("podFailurePolicy", {}).get("rules", [])
    for code, why in ((2, "bad input: permanent"), (3, "the chief is gone for good")):
        if not any(r.get("action") == "FailJob" and r.get("onExitCodes", {}).get(
                "operator") == "In" and code in r.get("onExitCodes", {}).get("values", [])
                for r in rules):
            problems.append((where, f"exit code {code} ({why}) does not fail the Job at once "
                             f"(podFailurePolicy FailJob onExitCodes In [{code}])"))
    component = job["metadata"].get("labels", {}).get("app.kubernetes.io/component")
    args = spec["template"]["spec"]["containers"][0].get("args", [])
    give_up = [a for a in args if a.startswith("--give_up_on_chief_secs=")]
    if component in ("ps", "worker") and (
            not give_up or not give_up[-1].split("=", 1)[1].isdigit() or
            int(give_up[-1].split("=", 1)[1]) <= 0):
        problems.append((where, "its tasks wait for a chief whose Job failed until the deadline "
                         "(--give_up_on_chief_secs=N, N > 0)"))
    ignores_disruption = any(r.get("action") == "Ignore" and any(
        c.get("type") == "DisruptionTarget" for c in r.get("onPodConditions", []))
        for r in rules)
    if not ignores_disruption:
        problems.append((where, "an eviction counts against backoffLimit (podFailurePolicy "
                         "Ignore onPodConditions DisruptionTarget)"))
    tolerated = {t.get("key"): t.get("tolerationSeconds")
                 for t in spec["template"]["spec"].get("tolerations", [])
                 if t.get("effect") == "NoExecute"}
    for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not isinstance(tolerated.get(taint), int) or tolerated[taint] > 60:
            problems.append((where, f"a pod on a node with {taint} waits "
                             f"{tolerated.get(taint, 300)} s before it is evicted (at most 60)"))
    if not isinstance(spec.get("activeDeadlineSeconds"), int) or \
            spec.get("activeDeadlineSeconds") <= 0:
        problems.append((where, "has no activeDeadlineSeconds: a run that never ends holds its "
                         "nodes forever"))
    return problems


# What `kubectl delete <kinds> -l app.kubernetes.io/instance=<instance>` removes (docs/deploy.md);
# the PersistentVolumeClaim of the checkpoints is kept.
TEARDOWN_KINDS = ("Job", "Service", "ConfigMap", "NetworkPolicy", "PodDisruptionBudget")


def disruption_budget_problems(objects):
    """What is wrong with the PodDisruptionBudgets of rendered `objects`, as (where, message).

    Job pods have no scale subresource: Kubernetes accepts only an integer minAvailable in a
    budget selecting them (with maxUnavailable or a percentage the disruption controller cannot
    compute the pods expected and allows no eviction at all). The chief's and the ps tasks' pods
    must each be covered by a budget asking for every pod it selects.
    """
    problems = []
    pods = []  # (component, labels, count) of each Job's pods
    for job in (o for o in objects if o.get("kind") == "Job"):
        labels = job["spec"]["template"]["metadata"].get("labels", {})
        count = job["spec"].get("completions")
        pods.append((labels.get("app.kubernetes.io/component"), labels,
                     count if isinstance(count, int) else 0))
    covered = set()
    for pdb in (o for o in objects if o.get("kind") == "PodDisruptionBudget"):
        where = f"PodDisruptionBudget/{pdb['metadata']['name']}"
        spec = pdb.get("spec", {})
        match = spec.get("selector", {}).get("matchLabels", {})
        if spec.get("selector", {}).get("matchExpressions"):
            problems.append((where, "selects with matchExpressions; use matchLabels (checked "
                             "here against the Jobs' pods)"))
            continue
        selected = [(c, n) for c, labels, n in pods
                    if all(labels.get(k) == v for k, v in match.items())]
        if not selected:
            problems.append((where, "selects no Job's pods"))
            continue
        if "maxUnavailable" in spec:
            problems.append((where, "sets maxUnavailable on Job pods, which have no scale "
                             "subresource: Kubernetes then allows no eviction at all; use an "
                             "integer minAvailable"))
            continue
        want = sum(n for _, n in selected)
        got = spec.get("minAvailable")
        if not isinstance(got, int) or isinstance(got, bool):
            problems.append((where, f"minAvailable {got!r}: Job pods take an integer, not a "
                             "percentage"))
        elif got != want:
            problems.append((where, f"minAvailable {got}, but it selects {want} pods "
                             f"({', '.join(sorted({c for c, _ in selected}))}): each must stay"))
        else:
            covered.update(c for c, _ in selected)
    for component in ("chief", "ps"):
        if component not in covered:
            problems.append(("PodDisruptionBudget", f"no budget keeps every {component} pod: a "
                             "node drain would take one and cost a recovery"))
    return problems


def check_overlay(overlay, entrypoint):
    objects = render(overlay)
    if not objects:
        return
    name = os.path.basename(overlay)
    for obj in objects:
        check_schema(f"{name}/{obj.get('kind')}/{obj.get('metadata', {}).get('name')}", obj)

    def of_kind(kind):
        return [o for o in objects if o.get("kind") == kind]

    config_maps = {o["metadata"]["name"]: o for o in of_kind("ConfigMap")}
    claims = {o["metadata"]["name"] for o in of_kind("PersistentVolumeClaim")}
    # The documented teardown (docs/deploy.md) deletes TEARDOWN_KINDS by the overlay's instance
    # label and keeps the checkpoint claim: it must reach every other object, and the claim
    # must be the only thing left.
    for obj in objects:
        kind = obj.get("kind")
        where = f"{name}/{kind}/{obj.get('metadata', {}).get('name')}"
        labels = obj.get("metadata", {}).get("labels", {})
        if kind == "PersistentVolumeClaim":
            continue
        if kind not in TEARDOWN_KINDS:
            fail(where, f"the teardown of docs/deploy.md deletes {', '.join(TEARDOWN_KINDS)}; "
                 f"a {kind} would be left behind")
        if not labels.get("app.kubernetes.io/instance"):
            fail(where, "has no app.kubernetes.io/instance label: the teardown would miss it")
    for where, message in disruption_budget_problems(objects):
        fail(f"{name}/{where}", message)
    for where, message in claim_problems(objects):
        fail(f"{name}/{where}", message)
    for where, message in operator_access_problems(objects, entrypoint):
        fail(f"{name}/{where}", message)
    for where, message in gpu_image_problems(objects):
        fail(f"{name}/{where}", message)
    services = of_kind("Service")
    if len(services) != 1:
        fail(name, f"expected one Service, found {len(services)}")
        return
    service = services[0]
    svc = service["metadata"]["name"]
    spec = service["spec"]
    if spec.get("clusterIP") != "None" or spec.get("publishNotReadyAddresses") is not True:
        fail(name, f"Service {svc} must be headless and publish not-ready addresses")
    ports = [p for p in spec.get("ports", []) if p.get("name") == "grpc"]
    if len(ports) != 1:
        fail(name, f"Service {svc} has no port named grpc")
        return
    port = ports[0]["port"]
    selector = spec.get("selector", {})
    if not selector:
        fail(name, f"Service {svc} selects nothing")

    jobs = {}
    for job in of_kind("Job"):
        component = job["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        jobs[component] = job
    if set(jobs) != {"chief", "ps", "worker"}:
        fail(name, f"expected Jobs for chief, ps and worker, found {sorted(jobs)}")
        return
    # (A completions that is not a number is the schema check's failure; count it as 0 here.)
    counts = {c: jobs[c]["spec"].get("completions") for c in jobs}
    counts = {c: n if isinstance(n, int) and not isinstance(n, bool) else 0
              for c, n in counts.items()}
    if counts["chief"] != 1:
        fail(name, f"the chief Job has {counts['chief']} completions, expected 1")
    expected_hosts = set()
    for component, job in jobs.items():
        expected_hosts.update(f"{svc}-{component}-{i}.{svc}:{port}"
                              for i in range(counts[component]))

    policy_ports = set()
    egress_ports = set()
    for policy in of_kind("NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            policy_ports.update(p.get("port") for p in rule.get("ports", []))
        for rule in policy["spec"].get("egress", []):
            egress_ports.update(p.get("port") for p in rule.get("ports", []))
        pod_selector = policy["spec"].get("podSelector", {}).get("matchLabels", {})
        if not pod_selector or any(selector.get(k) != v for k, v in pod_selector.items()):
            fail(name, f"NetworkPolicy {policy['metadata']['name']} does not select the "
                 "cluster's pods (and only them)")
    cluster_cms = [cm for n, cm in config_maps.items() if "NUM_PS" in cm.get("data", {})]
    metrics_port = int(cluster_cms[0]["data"]["METRICS_PORT"]) if cluster_cms and \
        "METRICS_PORT" in cluster_cms[0]["data"] else None
    # The ps tasks' tensor data plane: a fixed port (DATA_PORT, 2223 by default), admitted both
    # ways, or the workers' pulls and pushes are dropped under an enforcing network plugin.
    data_port = int(cluster_cms[0]["data"].get("DATA_PORT", 2223)) if cluster_cms else 2223
    if policy_ports != {port, data_port, metrics_port}:
        fail(name, f"the NetworkPolicy admits ports {sorted(policy_ports, key=str)}, the cluster "
             f"uses {port}, the data plane {data_port} and metrics {metrics_port}")
    if not {port, data_port} <= egress_ports:
        fail(name, f"the NetworkPolicy lets the pods reach ports {sorted(egress_ports, key=str)}; "
             f"they call each other on {port} and the ps tasks' data plane on {data_port}")

    for component, job in jobs.items():
        where = f"{name}/Job/{job['metadata']['name']}"
        if job["metadata"]["name"] != f"{svc}-{component}":
            fail(where, f"must be named {svc}-{component}: its pods' host names are the tasks' names")
        jspec = job["spec"]
        if jspec.get("completionMode") != "Indexed":
            fail(where, "is not an Indexed Job")
        if jspec.get("parallelism") != jspec.get("completions"):
            fail(where, "parallelism differs from completions: every task runs at once")
        pod = jspec["template"]["spec"]
        labels = jspec["template"]["metadata"].get("labels", {})
        if any(labels.get(k) != v for k, v in selector.items()):
            fail(where, f"pods lack the Service's selector labels {selector}")
        if pod.get("subdomain") != svc:
            fail(where, f"subdomain is {pod.get('subdomain')}, not the Service {svc}")
        container = pod["containers"][0]
        check_pod_security(where, pod, container)
        for _, message in failure_policy_problems(job):
            fail(where, message)
        grpc_ports = [p["containerPort"] for p in container.get("ports", [])
                      if p.get("name") == "grpc"]
        if grpc_ports != [port]:
            fail(where, f"container port {grpc_ports}, the Service says {port}")
        metrics_ports = [p["containerPort"] for p in container.get("ports", [])
                         if p.get("name") == "metrics"]
        annotations = jspec["template"]["metadata"].get("annotations", {})
        if (metrics_ports != [metrics_port] or annotations.get("prometheus.io/scrape") != "true"
                or annotations.get("prometheus.io/port") != str(metrics_port)):
            fail(where, f"metrics port {metrics_ports}, annotations {annotations}; the "
                 f"ConfigMap's METRICS_PORT is {metrics_port}")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        secret = volumes.get("tls", {}).get("secret", {}).get("secretName")
        if secret != f"{svc}-tls-{component}":
            fail(where, f"TLS Secret {secret}, make_tls_secrets.sh --service {svc} makes "
                 f"{svc}-tls-{component}")
        for volume in volumes.values():
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim is not None and claim not in claims:
                fail(where, f"claims volume {claim}, which is not rendered")
            cm = volume.get("configMap", {}).get("name")
            if cm is not None and cm not in config_maps:
                fail(where, f"mounts ConfigMap {cm}, which is not rendered")
        if component in ("chief", "ps"):
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            claim = volumes.get(mounts.get("/checkpoints"), {}).get("persistentVolumeClaim")
            if not claim:
                fail(where, "has no shared checkpoint volume at /checkpoints")
            if "--checkpoint_dir=/checkpoints" not in container.get("args", []):
                fail(where, "is not given --checkpoint_dir=/checkpoints")
        if component == "ps":
            data_ports = [p["containerPort"] for p in container.get("ports", [])
                          if p.get("name") == "data"]
            if data_ports != [data_port]:
                fail(where, f"data plane port {data_ports}, the ConfigMap's DATA_PORT is "
                     f"{data_port}")
            res = container.get("resources", {})
            if not res.get("limits") or res.get("requests") != res.get("limits"):
                fail(where, "ps requests must equal limits (guaranteed QoS)")
        for probe in ("readinessProbe", "livenessProbe"):
            if "exec" not in container.get(probe, {}):
                fail(where, f"has no {probe}")
        if any(a.startswith("--device=gpu") for a in container.get("args", [])):
            for where_, message in gpu_placement_problems(pod):
                fail(f"{where}{where_}", message)

        env = pod_env(where, container, config_maps)
        for index in range(counts[component]):
            host = f"{svc}-{component}-{index}"
            penv = dict(env, HOSTNAME=host, JOB_COMPLETION_INDEX=str(index),
                        TLS_DIR="/nonexistent")
            code, out, err = dry_run(entrypoint, penv, container.get("args", []))
            if code != 0:
                fail(f"{where}[{index}]", f"entrypoint.sh failed: {err.strip()}")
                continue
            if component == "ps" and f"--data_port={data_port}" not in out:
                fail(f"{where}[{index}]", f"the ps is not started on --data_port={data_port}: "
                     f"{out.strip()!r}")
            config = json.loads(out.splitlines()[0][len("TF_CONFIG="):])
            addresses = set()
            for job_name, hosts in config["cluster"].items():
                addresses.update(hosts)
            if addresses != expected_hosts:
                fail(f"{where}[{index}]", f"TF_CONFIG names {sorted(addresses)}, the pods are "
                     f"{sorted(expected_hosts)}")
            if config["task"] != {"type": component, "index": index}:
                fail(f"{where}[{index}]", f"TF_CONFIG task is {config['task']}")
            if f"--metrics_port={metrics_port} " not in out.splitlines()[1] + " ":
                fail(f"{where}[{index}]", f"the daemon is not given --metrics_port={metrics_port}: "
                     f"{out.splitlines()[1]}")
            for probe in ("readinessProbe", "livenessProbe"):
                command = container[probe]["exec"]["command"]
                code, out, err = dry_run(command[0].replace("/opt/pscluster/entrypoint.sh",
                                                            entrypoint), penv, command[1:])
                want = f"health 127.0.0.1:{port} --tls_server_name={host}.{svc}"
                if code != 0 or want not in out:
                    fail(f"{where}[{index}]", f"{probe} runs {out.strip()!r} {err.strip()}, "
                         f"expected psctl {want}")


def check_entrypoint_refusals(entrypoint):
    good = {"JOB": "ps", "NUM_PS": "2", "NUM_WORKERS": "2", "PORT": "2222",
            "HOSTNAME": "pscluster-ps-1", "JOB_COMPLETION_INDEX": "1", "TLS_DIR": "/nonexistent"}
    code, out, _ = dry_run(entrypoint, good, [])
    if code != 0 or '"task":{"type":"ps","index":1}' not in out:
        fail("entrypoint.sh", f"a good pod environment failed: {out}")
    cases = [
        ({"JOB": ""}, "JOB is not set"),
        ({"JOB": "evaluator"}, 'JOB is "evaluator" (expected chief, ps or worker)'),
        ({"NUM_PS": "two"}, 'NUM_PS is "two" (expected a whole number'),
        ({"PORT": "70000"}, "PORT is 70000 (expected 1-65535)"),
        ({"METRICS_PORT": "http"}, 'METRICS_PORT is "http" (expected 1-65535, or unset'),
        ({"DATA_PORT": "2222"}, 'DATA_PORT is "2222" (expected 1-65535, not PORT)'),
        ({"DATA_PORT": "0"}, 'DATA_PORT is "0" (expected 1-65535, not PORT)'),
        ({"HOSTNAME": "ps-1"}, "host name ps-1 is not <service>-ps-1"),
        ({"HOSTNAME": "pscluster-ps-3", "JOB_COMPLETION_INDEX": "3"},
         "ps index 3 is not below the cluster's 2 ps task(s)"),
    ]
    chief = dict(good, JOB="chief", HOSTNAME="pscluster-chief-0", JOB_COMPLETION_INDEX="0",
                 PSCTL_TLS_DIR="/nonexistent")
    for args, message in [
        (["psctl", "status"], "no operator certificates in /nonexistent: make the Secret "
         "pscluster-tls-psctl"),
        (["psctl"], "psctl takes a command"),
        (["psctl", "--admin"], "psctl takes a command"),
    ]:
        code, out, err = dry_run(entrypoint, chief, args)
        if code != 2 or message not in err or out:
            fail("entrypoint.sh", f"{' '.join(args)} without certificates: exit {code}, "
                 f"{err.strip()!r}; expected exit 2 and {message!r}")
    code, out, _ = dry_run(entrypoint, dict(chief, ALLOW_INSECURE="1"), ["psctl", "status"])
    if code != 0 or "--chief=pscluster-chief-0.pscluster:2222" not in out or "--tls" in out:
        fail("entrypoint.sh", f"psctl status of an insecure cluster runs {out.strip()!r}")
    for change, message in cases:
        code, out, err = dry_run(entrypoint, dict(good, **change), [])
        if code != 2 or message not in err or out:
            fail("entrypoint.sh", f"with {change}: exit {code}, {err.strip()!r}; expected exit 2 "
                 f"and {message!r}")


def claim_problems(objects):
    """What is wrong with the checkpoint claim of rendered `objects`, as (where, message): it
    is mounted on several nodes (ReadWriteMany) and must name its storage class, since the big
    clouds' default classes are ReadWriteOnce (the claim would stay Pending)."""
    problems = []
    claims = [o for o in objects if o.get("kind") == "PersistentVolumeClaim"]
    if len(claims) != 1:
        return [("PersistentVolumeClaim", f"expected one checkpoint claim, found {len(claims)}")]
    where = f"PersistentVolumeClaim/{claims[0]['metadata']['name']}"
    spec = claims[0].get("spec", {})
    if spec.get("accessModes") != ["ReadWriteMany"]:
        problems.append((where, f"access modes {spec.get('accessModes')}: the chief and the ps "
                         "tasks mount it from several nodes (ReadWriteMany)"))
    if not spec.get("storageClassName"):
        problems.append((where, "names no storageClassName (CHECKPOINT_STORAGE_CLASS): a "
                         "cloud's default class is ReadWriteOnce and the claim would not bind"))
    return problems


def gpu_placement_problems(pod):
    """What lets a GPU worker's pod land where the image cannot run, as (where, message): the
    image's kernels are SASS for compute capability 8.0-9.0 plus PTX (--config=cuda_portable)
    and need CUDA 13's R580+ driver, so the pod must require GPU feature discovery's
    nvidia.com/gpu.compute.major > 7 and nvidia.com/cuda.driver.major > 579, and ask for a GPU."""
    problems = []
    container = pod["containers"][0]
    if container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") != "1":
        problems.append(("", "a --device=gpu worker must ask for one nvidia.com/gpu"))
    terms = pod.get("affinity", {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    wanted = {("nvidia.com/gpu.compute.major", "Gt", ("7",)),
              ("nvidia.com/cuda.driver.major", "Gt", ("579",))}

    def expressions(term):
        return {(e.get("key"), e.get("operator"), tuple(e.get("values", [])))
                for e in term.get("matchExpressions", [])}
    # (The terms are alternatives: each must carry both.)
    if not terms or any(not wanted <= expressions(t) for t in terms):
        problems.append(("", "a --device=gpu worker must require nodes of compute capability "
                         "8.0+ (nvidia.com/gpu.compute.major Gt 7) with an R580+ driver "
                         "(nvidia.com/cuda.driver.major Gt 579): the image's kernels run "
                         "nowhere else"))
    return problems


def gpu_image_problems(objects):
    """Pods that use no GPU but run the GPU workers' image (CUDA's libraries pulled onto every
    node for nothing), as (where, message)."""
    pods = [(job["metadata"]["name"], job["spec"]["template"]["spec"]["containers"][0])
            for job in objects if job.get("kind") == "Job"]
    gpu = lambda c: any(a.startswith("--device=gpu") for a in c.get("args", []))
    gpu_images = {c.get("image") for _, c in pods if gpu(c)}
    return [(name, f"uses no GPU but runs the GPU workers' image {c.get('image')}")
            for name, c in pods if not gpu(c) and c.get("image") in gpu_images]


def operator_access_problems(objects, entrypoint):
    """What keeps an operator from running psctl as docs/deploy.md says, as (where, message):
    `kubectl exec job/<service>-chief -- /opt/pscluster/entrypoint.sh psctl status` needs the
    Secret <service>-tls-psctl (make_tls_secrets.sh) mounted in the chief's pod at
    /etc/pscluster/psctl, and the entrypoint to dial the chief by the name its certificate
    carries with the viewer's certificate (the admin's with --admin)."""
    services = [o for o in objects if o.get("kind") == "Service"]
    chiefs = [o for o in objects if o.get("kind") == "Job" and o["metadata"].get(
        "labels", {}).get("app.kubernetes.io/component") == "chief"]
    if len(services) != 1 or len(chiefs) != 1:
        return [("Job", "expected one Service and one chief Job")]
    svc = services[0]["metadata"]["name"]
    port = [p["port"] for p in services[0]["spec"].get("ports", []) if p.get("name") == "grpc"]
    where = f"Job/{chiefs[0]['metadata']['name']}"
    pod = chiefs[0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    problems = []
    volume = volumes.get(mounts.get("/etc/pscluster/psctl"), {})
    if volume.get("secret", {}).get("secretName") != f"{svc}-tls-psctl":
        problems.append((where, f"mounts {volume.get('secret', {}).get('secretName')} at "
                         f"/etc/pscluster/psctl; operators' psctl needs {svc}-tls-psctl "
                         "(make_tls_secrets.sh) there"))
    if not port:
        return problems + [(where, "the Service has no grpc port")]
    env = {"JOB": "chief", "NUM_PS": "1", "NUM_WORKERS": "1", "PORT": str(port[0]),
           "HOSTNAME": f"{svc}-chief-0", "JOB_COMPLETION_INDEX": "0", "TLS_DIR": "/nonexistent"}
    with tempfile.TemporaryDirectory() as certs:
        for f in ("ca.pem", "psctl-viewer.pem", "psctl-viewer.key", "psctl-admin.pem",
                  "psctl-admin.key"):
            open(os.path.join(certs, f), "w").close()
        env["PSCTL_TLS_DIR"] = certs
        for extra, cert in (([], "psctl-viewer"), (["--admin"], "psctl-admin")):
            code, out, err = dry_run(entrypoint, env, ["psctl"] + extra + ["status"])
            want = [f"psctl status --chief={svc}-chief-0.{svc}:{port[0]}",
                    f"--tls_cert_file={certs}/{cert}.pem", f"--tls_key_file={certs}/{cert}.key",
                    f"--tls_ca_file={certs}/ca.pem"]
            if code != 0 or not all(w in out for w in want):
                problems.append(("entrypoint.sh", f"psctl {' '.join(extra)} status runs "
                                 f"{out.strip()!r} {err.strip()!r}; expected {want}"))
    return problems


def pod_monitor_problems(objects):
    """What keeps the Prometheus Operator from scraping the cluster through
    components/prometheus-operator's PodMonitor, as (where, message): it must select exactly
    the Service's pods (the instance label included: another cluster's PodMonitor must not
    scrape these), on a port named as every pod's metrics port, at /metrics."""
    monitors = [o for o in objects if o.get("kind") == "PodMonitor"]
    services = [o for o in objects if o.get("kind") == "Service"]
    if len(monitors) != 1 or len(services) != 1:
        return [("PodMonitor", f"expected one PodMonitor and one Service, found "
                 f"{len(monitors)} and {len(services)}")]
    where = f"PodMonitor/{monitors[0]['metadata']['name']}"
    spec = monitors[0]["spec"]
    problems = []
    selector = spec.get("selector", {}).get("matchLabels", {})
    pods = services[0]["spec"].get("selector", {})
    # (The pods' own labels: the Service's selector. The instance and name labels pick out this
    # cluster's pods; the base's other selector labels may be left out.)
    if any(pods.get(k) != v for k, v in selector.items()) or not all(
            selector.get(k) == pods.get(k) for k in ("app.kubernetes.io/instance",
                                                     "app.kubernetes.io/name")):
        problems.append((where, f"selects {selector}, the cluster's pods are {pods} (its "
                         "instance and name labels at least)"))
    if monitors[0]["metadata"].get("labels", {}).get("app.kubernetes.io/instance") != \
            selector.get("app.kubernetes.io/instance"):
        problems.append((where, "its instance label differs from its selector's"))
    endpoints = spec.get("podMetricsEndpoints", [])
    for job in (o for o in objects if o.get("kind") == "Job"):
        ports = {p.get("name") for p in job["spec"]["template"]["spec"]["containers"][0].get(
            "ports", [])}
        for e in endpoints:
            if e.get("port") not in ports:
                problems.append((where, f"scrapes port {e.get('port')!r}, which "
                                 f"{job['metadata']['name']}'s pods do not name"))
    if [e.get("path") for e in endpoints] != ["/metrics"]:
        problems.append((where, f"scrapes {[e.get('path') for e in endpoints]}, expected one "
                         "endpoint at /metrics"))
    return problems


def render_with_component(overlay, component):
    """`overlay` rendered with ../../components/<component> added after the cluster's."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "kubernetes")
        shutil.copytree(os.path.dirname(os.path.dirname(overlay)), tree)
        copy = os.path.join(tree, "overlays", os.path.basename(overlay))
        path = os.path.join(copy, "kustomization.yaml")
        with open(path) as f:
            text = f.read()
        if "  - ../../components/cluster\n" not in text:
            fail(overlay, "does not list ../../components/cluster")
            return []
        with open(path, "w") as f:
            f.write(text.replace("  - ../../components/cluster\n",
                                 "  - ../../components/cluster\n"
                                 f"  - ../../components/{component}\n"))
        return render(copy)


def check_prometheus_operator_component(overlay):
    """Each overlay with components/prometheus-operator added: its PodMonitor scrapes the
    cluster's pods and only them; a PodMonitor that lost the instance label is caught."""
    objects = render_with_component(overlay, "prometheus-operator")
    name = os.path.basename(overlay) + "+prometheus-operator"
    for where, message in pod_monitor_problems(objects):
        fail(f"{name}/{where}", message)
    planted = json.loads(json.dumps(objects))
    for o in planted:
        if o.get("kind") == "PodMonitor":
            o["spec"]["selector"]["matchLabels"].pop("app.kubernetes.io/instance", None)
    if not pod_monitor_problems(planted):
        fail(name, "a PodMonitor selecting every instance's pods was not caught")


def check_image_pull_secret_component(overlay):
    """Each overlay with components/image-pull-secret added: every task's pod pulls with the
    Secret pscluster-registry, and the rest renders as without it."""
    objects = render_with_component(overlay, "image-pull-secret")
    name = os.path.basename(overlay) + "+image-pull-secret"
    jobs = [o for o in objects if o.get("kind") == "Job"]
    if not jobs:
        fail(name, "renders no Job")
    for job in jobs:
        secrets = job["spec"]["template"]["spec"].get("imagePullSecrets")
        if secrets != [{"name": "pscluster-registry"}]:
            fail(f"{name}/{job['metadata']['name']}", f"pulls with {secrets}, expected the "
                 "Secret pscluster-registry")
        job["spec"]["template"]["spec"].pop("imagePullSecrets", None)
    if objects != render(overlay):
        fail(name, "changes more than the pods' imagePullSecrets")


def check_planted_mistakes(overlay, entrypoint):
    """Each kind of budget, claim and operator-access mistake, planted in a rendered overlay,
    is caught."""
    objects = render(overlay)
    if not objects:
        return
    plants = {
        "maxUnavailable": lambda pdb: pdb["spec"].update({"maxUnavailable": 0}),
        "a percentage": lambda pdb: pdb["spec"].update({"minAvailable": "100%"}),
        "too few pods": lambda pdb: pdb["spec"].update({"minAvailable": 1}),
    }
    for what, plant in plants.items():
        planted = json.loads(json.dumps(objects))
        ps = [o for o in planted if o.get("kind") == "PodDisruptionBudget"
              and o["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component") == "ps"]
        if len(ps) != 1:
            fail(overlay, "expected one PodDisruptionBudget selecting the ps pods")
            return
        plant(ps[0])
        if not disruption_budget_problems(planted):
            fail(overlay, f"a ps budget with {what} was not caught")
    planted = json.loads(json.dumps(objects))
    for o in planted:
        if o.get("kind") == "PersistentVolumeClaim":
            o["spec"].pop("storageClassName", None)
    if not claim_problems(planted):
        fail(overlay, "a checkpoint claim without a storage class was not caught")
    for what, plant in {
        "no operator certificates": lambda pod: pod.update(
            volumes=[v for v in pod["volumes"] if v["name"] != "psctl"]),
        "another job's Secret": lambda pod: [
            v["secret"].update(secretName=v["secret"]["secretName"].replace("psctl", "worker"))
            for v in pod["volumes"] if v["name"] == "psctl"],
    }.items():
        planted = json.loads(json.dumps(objects))
        for o in planted:
            if o.get("kind") == "Job" and o["metadata"]["labels"].get(
                    "app.kubernetes.io/component") == "chief":
                plant(o["spec"]["template"]["spec"])
        if not operator_access_problems(planted, entrypoint):
            fail(overlay, f"a chief with {what} for psctl was not caught")
    for what, plant in {
        "restarts in place": lambda job: job["spec"]["template"]["spec"].update(
            restartPolicy="OnFailure"),
        "no failure policy": lambda job: job["spec"].pop("podFailurePolicy"),
        "exit code 2 retried": lambda job: job["spec"]["podFailurePolicy"]["rules"][0][
            "onExitCodes"].update(values=[3]),
        "exit code 3 retried": lambda job: job["spec"]["podFailurePolicy"]["rules"][0][
            "onExitCodes"].update(values=[2]),
        "no deadline": lambda job: job["spec"].pop("activeDeadlineSeconds"),
        "the default eviction delay": lambda job: job["spec"]["template"]["spec"].update(
            tolerations=[t for t in job["spec"]["template"]["spec"]["tolerations"]
                         if t["key"] != "node.kubernetes.io/unreachable"]),
    }.items():
        for job in (o for o in objects if o.get("kind") == "Job"):
            planted = json.loads(json.dumps(job))
            plant(planted)
            if not failure_policy_problems(planted):
                fail(overlay, f"a Job with {what} was not caught")
    for job in (o for o in objects if o.get("kind") == "Job" and o["metadata"]["labels"].get(
            "app.kubernetes.io/component") in ("ps", "worker")):
        planted = json.loads(json.dumps(job))
        container = planted["spec"]["template"]["spec"]["containers"][0]
        container["args"] = [a for a in container["args"]
                             if not a.startswith("--give_up_on_chief_secs")]
        if not failure_policy_problems(planted):
            fail(overlay, f"{job['metadata']['name']} waiting for ever on a failed chief was not "
                 "caught")
    dropped = [o for o in objects if o.get("kind") != "PodDisruptionBudget"]
    if not any("chief" in m for _, m in disruption_budget_problems(dropped)):
        fail(overlay, "a cluster without disruption budgets was not caught")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[1])
    if shutil.which("kubectl") is None:
        print("check_manifests.py: kubectl (with kustomize) is not on PATH", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        # A real copy: kustomize refuses files that resolve outside a kustomization (Bazel's
        # runfiles are links into the source tree).
        tree = os.path.join(tmp, "kubernetes")
        shutil.copytree(os.path.join(root, "deploy/kubernetes"), tree, symlinks=False)
        entrypoint = os.path.join(tree, "entrypoint.sh")
        overlays = sorted(os.path.join(tree, "overlays", d)
                          for d in os.listdir(os.path.join(tree, "overlays")))
        for overlay in overlays:
            check_overlay(overlay, entrypoint)
            check_prometheus_operator_component(overlay)
            check_image_pull_secret_component(overlay)
        check_entrypoint_refusals(entrypoint)
        check_planted_mistakes(overlays[0], entrypoint)
        for overlay in overlays:
            for job in render(overlay):
                if job.get("kind") != "Job":
                    continue
                pod = job["spec"]["template"]["spec"]
                if not any(a.startswith("--device=gpu") for a in pod["containers"][0].get(
                        "args", [])):
                    continue
                pod.pop("affinity", None)
                if not gpu_placement_problems(pod):
                    fail(overlay, "a GPU worker without node affinity was not caught")
            planted = render(overlay)
            workers = [j for j in planted if j.get("kind") == "Job" and any(
                a.startswith("--device=gpu")
                for a in j["spec"]["template"]["spec"]["containers"][0].get("args", []))]
            for job in planted:
                if job.get("kind") == "Job" and workers and job not in workers:
                    job["spec"]["template"]["spec"]["containers"][0]["image"] = (
                        workers[0]["spec"]["template"]["spec"]["containers"][0]["image"])
            if workers and not gpu_image_problems(planted):
                fail(overlay, "a chief and ps on the GPU image were not caught")
        with open(os.path.join(tree, "base/model.pbtxt")) as a, \
                open(os.path.join(root, "configs/mlp.pbtxt")) as b:
            if a.read() != b.read():
                fail("base/model.pbtxt", "differs from configs/mlp.pbtxt (copy it again)")
        print(f"checked overlays: {', '.join(os.path.basename(o) for o in overlays)}")
    for f in FAILURES:
        print(f"FAIL {f}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
