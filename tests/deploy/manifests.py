"""Checks deploy/kubernetes: every document against Kubernetes' own schema
(kubernetes-validate, strict: an unknown field is an error), KEDA's
ScaledObject against the `temporal` scaler's documented fields, and the
manifests against the configuration they mount (ports, probe paths,
volumes, resources, grace periods, task queues). Prints what a running host
must then serve, as JSON; exits 1 naming every problem.

    python3 tests/deploy/manifests.py deploy/kubernetes
"""

import glob
import json
import os
import re
import sys
import tomllib

import kubernetes_validate
import yaml

KUBERNETES = "1.34"
# KEDA's `temporal` scaler (keda.sh/docs/2.22/scalers/temporal).
KEDA_TEMPORAL_KEYS = {
    "endpoint", "endpointFromEnv", "namespace", "taskQueue", "targetQueueSize",
    "activationTargetQueueSize", "queueTypes", "workerDeploymentName",
    "workerDeploymentBuildId", "includeRunningWorkflowCount",
    "workflowTaskQueueForCount", "minConnectTimeout", "unsafeSsl",
    "tlsServerName", "enableTLS", "apiKey", "apiKeyFromEnv",
}
# Outside the tasks' own time: corral's reports and the engine's answer.
REPORTING = 10

problems = []


def problem(text):
    problems.append(text)


def duration(text):
    """Seconds of a corral duration (`30s`, `5m`, `500ms`, `1h`)."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not m:
        raise ValueError(f"not a duration: {text}")
    n, unit = int(m.group(1)), m.group(2)
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def size(text):
    """Bytes of a corral or Kubernetes size (`64MiB`, `2Gi`)."""
    m = re.fullmatch(r"(\d+)(B|KiB|MiB|GiB|Ki|Mi|Gi)?", text)
    if not m:
        raise ValueError(f"not a size: {text}")
    unit = {"B": 1, None: 1, "KiB": 1 << 10, "Ki": 1 << 10, "MiB": 1 << 20,
            "Mi": 1 << 20, "GiB": 1 << 30, "Gi": 1 << 30}[m.group(2)]
    return int(m.group(1)) * unit


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def main(directory):
    docs = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        for doc in yaml.safe_load_all(open(path)):
            name = os.path.basename(path)
            if doc.get("kind") == "Kustomization":
                for resource in doc.get("resources", []):
                    if not os.path.exists(os.path.join(directory, resource)):
                        problem(f"{name}: names {resource}, which is not there")
                continue
            if doc.get("apiVersion") == "keda.sh/v1alpha1":
                check_keda(name, doc)
            else:
                try:
                    kubernetes_validate.validate(doc, KUBERNETES, strict=True)
                except Exception as e:  # the validator's own error types
                    problem(f"{name}: {doc.get('kind')}: {type(e).__name__}: {e}")
            docs.setdefault(doc["kind"], []).append(doc)

    # The cross-checks read the documents as the schemas describe them.
    if problems:
        fail()

    config_text = docs["ConfigMap"][0]["data"]["corral.toml"]
    config = tomllib.loads(config_text)
    host = config["host"]
    deployment = docs["Deployment"][0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    # Ports: the configuration's listeners are the container's ports, and
    # the Service's.
    if ports.get("admin") != port_of(host["admin_listen"]):
        problem(f"the admin port {ports.get('admin')} is not admin_listen's ({host['admin_listen']})")
    if ports.get("metrics") != port_of(host["metrics_listen"]):
        problem(f"the metrics port {ports.get('metrics')} is not metrics_listen's ({host['metrics_listen']})")
    for service in docs["Service"]:
        for p in service["spec"]["ports"]:
            if p["targetPort"] not in ports or p["port"] != ports[p["targetPort"]]:
                problem(f"Service port {p} is not a container port {ports}")
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/port") not in (None, str(ports["metrics"])):
        problem("the scrape annotation's port is not the metrics port")

    # Probes: on the metrics port, at the paths corral serves.
    probes = {}
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(kind)
        if probe:
            get = probe["httpGet"]
            if get["port"] not in ("metrics", ports["metrics"]):
                problem(f"{kind} asks port {get['port']}, not the metrics port")
            probes[kind] = get["path"]

    # Volumes: the configuration's directories are mounted, and writable.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for key in ("data_dir", "cache_dir"):
        mount = mounts.get(host[key])
        if not mount or mount.get("readOnly"):
            problem(f"{key} ({host[key]}) is not a writable volume mount")
    if "/etc/corral/corral.toml" not in mounts:
        problem("the configuration is not mounted at /etc/corral/corral.toml")
    if container.get("args", [])[-1:] != ["/etc/corral/corral.toml"]:
        problem("the container does not serve /etc/corral/corral.toml")
    tls = host.get("admin_tls")
    if tls:
        for key in ("cert", "key"):
            if not any(tls[key].startswith(m + "/") for m in mounts):
                problem(f"admin_tls.{key} ({tls[key]}) is on no volume")
    if container.get("securityContext", {}).get("readOnlyRootFilesystem") and "/tmp" not in mounts:
        problem("a read-only root file system with no /tmp volume")

    # Resources: the CPU limit is the host's slots; the memory limit holds
    # every task at its tenant's memory limit, a compile and the host.
    limits = container["resources"]["limits"]
    requests = container["resources"]["requests"]
    tenants = config["tenant"]
    largest = max(size(t.get("limits", {}).get("memory", "128MiB")) for t in tenants)
    needed = host.get("max_concurrent", 256) * largest
    needed += size(host.get("compile_memory", "2GiB")) * host.get("max_compiles", 1)
    needed += 256 << 20
    if size(limits["memory"]) < needed:
        problem(f"memory limit {limits['memory']} is under the {needed >> 20} MiB the configuration may use")
    if requests != limits:
        problem("requests and limits differ: the host's slots follow its CPU limit")
    warm = host.get("max_warm_instances", 64)
    if warm and host.get("max_warm_instances") is None:
        problem("max_warm_instances is not set: warm instances' memory is not in the limit")

    # Stopping: the grace period covers the preStop, the drain, a task's
    # cancel grace and the reports.
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    cancel = max(duration(t.get("limits", {}).get("cancel_grace", "5s")) for t in tenants)
    drain = duration(host.get("shutdown_grace", "30s"))
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace < pre_stop + drain + cancel + REPORTING:
        problem(f"terminationGracePeriodSeconds {grace} < preStop {pre_stop} + shutdown_grace {drain} + cancel_grace {cancel} + {REPORTING} for reports")
    strategy = deployment["spec"]["strategy"]["rollingUpdate"]
    if strategy.get("maxUnavailable") != 0:
        problem("a rolling update may stop a pod before its successor is ready")

    # Autoscaling: KEDA's triggers are the tenants' task queues.
    queues = {(t["temporal"].get("namespace", "default"), t["temporal"]["task_queue"],
               t["temporal"]["address"].split("://")[-1]) for t in tenants if "temporal" in t}
    for scaled in docs.get("ScaledObject", []):
        if scaled["spec"]["scaleTargetRef"]["name"] != deployment["metadata"]["name"]:
            problem("the ScaledObject scales another Deployment")
        triggers = {(m["metadata"].get("namespace", "default"), m["metadata"]["taskQueue"],
                     m["metadata"]["endpoint"]) for m in scaled["spec"]["triggers"]}
        if triggers != queues:
            problem(f"KEDA's triggers {sorted(triggers)} are not the tenants' task queues {sorted(queues)}")
    metrics = []
    for hpa in docs.get("HorizontalPodAutoscaler", []):
        if hpa["spec"]["scaleTargetRef"]["name"] != deployment["metadata"]["name"]:
            problem("the HorizontalPodAutoscaler scales another Deployment")
        for m in hpa["spec"]["metrics"]:
            metric = m["pods"]["metric"]
            metrics.append({"name": metric["name"], "labels": metric.get("selector", {}).get("matchLabels", {})})
    for pdb in docs.get("PodDisruptionBudget", []):
        if pdb["spec"]["selector"]["matchLabels"] != deployment["spec"]["selector"]["matchLabels"]:
            problem("the PodDisruptionBudget selects other pods")

    if problems:
        fail()
    print(json.dumps({"config": config_text, "probes": probes, "ports": ports, "metrics": metrics}))


def fail():
    for p in problems:
        print(p, file=sys.stderr)
    sys.exit(1)


def check_keda(name, doc):
    if doc.get("kind") != "ScaledObject":
        problem(f"{name}: {doc.get('kind')} is not a KEDA kind this checks")
        return
    spec = doc.get("spec", {})
    if not spec.get("scaleTargetRef", {}).get("name"):
        problem(f"{name}: no scaleTargetRef.name")
    for key in ("minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod"):
        if key in spec and not isinstance(spec[key], int):
            problem(f"{name}: {key} is not a number")
    unknown = set(spec) - {"scaleTargetRef", "minReplicaCount", "maxReplicaCount",
                           "pollingInterval", "cooldownPeriod", "idleReplicaCount",
                           "fallback", "advanced", "triggers", "initialCooldownPeriod"}
    if unknown:
        problem(f"{name}: unknown fields {sorted(unknown)}")
    for trigger in spec.get("triggers", []):
        if trigger.get("type") != "temporal":
            problem(f"{name}: a `{trigger.get('type')}` trigger")
            continue
        metadata = trigger.get("metadata", {})
        for key in ("endpoint", "taskQueue"):
            if key not in metadata:
                problem(f"{name}: the temporal trigger has no {key}")
        for key, value in metadata.items():
            if key not in KEDA_TEMPORAL_KEYS:
                problem(f"{name}: `{key}` is not a temporal scaler parameter")
            if not isinstance(value, str):
                problem(f"{name}: {key} is not a string (KEDA's metadata are strings)")
        if metadata.get("queueTypes", "activity") not in ("workflow", "activity", "workflow,activity"):
            problem(f"{name}: queueTypes {metadata.get('queueTypes')}")


if __name__ == "__main__":
    main(sys.argv[1])
