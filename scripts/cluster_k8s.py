"""Kubernetes PyTorchJob manifests (Kubeflow training operator, kubeflow.org/v1) for scripts/cluster.py.

Retries: `restartPolicy: ExitCode` recreates a pod whose container exited with a signal's code (143 after SIGTERM,
137 after an OOM kill) and fails the job at once on 1-127 (2 is a user mistake: retrying cannot help). The job's
backoffLimit counts restarts of all its pods together, so it scales with the pod count. `cleanPodPolicy: Running`
deletes the pods still running when the job ends, so a failed job does not hold GPUs.
"""

from __future__ import annotations

import argparse
import copy
import re
from typing import TYPE_CHECKING

from cluster_quote import comment, identifier, sh
from cluster_vllm import k8s_documents
from errors import UserError, key_values

if TYPE_CHECKING:
    from cluster_env import EnvFile

RDZV_PORT = 29400
PYTORCHJOB_PORT_NAME = "pytorchjob-port"  # the training operator reads MASTER_PORT from this port
PYTORCHJOB_CONTAINER = "pytorch"  # ...of the container with this name
RESTARTS_PER_POD = 3
RUN_AS = "1000:1000"  # the image's default user (Dockerfile USER)
TOKEN_KEY = "HF_TOKEN"
TOKEN_DIR = "/run/secrets/trainkit"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(text: str, option: str) -> int:
    """A Kubernetes memory quantity (16Gi, 200G, 512Mi, 1000000) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", text.strip())
    if not match:
        raise UserError(f"{option} {text!r}: use a Kubernetes quantity such as 16Gi or 200G.")
    return int(match.group(1)) * _UNITS[match.group(2) or ""]


def memory_request(args: argparse.Namespace) -> str:
    """--mem plus the memory-backed /dev/shm, which counts against the pod's memory."""
    total = quantity_bytes(args.shm_size, "--shm-size") + (quantity_bytes(args.mem, "--mem") if args.mem else 0)
    return f"{total // 2**20}Mi" if total % 2**30 else f"{total // 2**30}Gi"


def env_items(env: EnvFile, args: argparse.Namespace) -> list[dict]:
    items: list[dict] = [{"name": name, "value": value} for name, value in env.settings.items()]
    if args.max_restarts is not None:
        items.append({"name": "TRAIN_MAX_RESTARTS", "value": str(args.max_restarts)})
    items.append({"name": "PYTHONNOUSERSITE", "value": "1"})
    if TOKEN_KEY in env.secrets:  # the Hub token as a file (see volumes): in no process environment
        items.append({"name": "HF_TOKEN_PATH", "value": f"{TOKEN_DIR}/{TOKEN_KEY}"})
    items += [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": args.secret_name, "key": name}}}
        for name in env.secrets
        if name != TOKEN_KEY
    ]
    return items


def token_volume(env: EnvFile, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """The Secret's HF_TOKEN as a read-only file, readable by the pod's group (fsGroup), named by HF_TOKEN_PATH."""
    if TOKEN_KEY not in env.secrets:
        return [], []
    secret = {"secretName": args.secret_name, "items": [{"key": TOKEN_KEY, "path": TOKEN_KEY}], "defaultMode": 0o440}
    return [{"name": "hf-token", "secret": secret}], [{"name": "hf-token", "mountPath": TOKEN_DIR, "readOnly": True}]


def volumes(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """(volumes, volumeMounts): memory-backed /dev/shm, the data/models/output/cache claims."""
    vols: list[dict] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": args.shm_size}}]
    mounts: list[dict] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    claims = [("data", args.data_pvc, "/data", True), ("models", args.models_pvc, "/models", True),
              ("output", args.output_pvc, "/output", False), ("cache", args.cache_pvc, "/cache", False)]  # fmt: skip
    for name, claim, path, read_only in claims:
        if not claim:
            continue
        vols.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}})
        mounts.append({"name": name, "mountPath": path, "readOnly": read_only})
    return vols, mounts


def toleration(spec: str) -> dict:
    """KEY[=VALUE][:EFFECT] -> a toleration (Exists without a value, Equal with one)."""
    match = re.fullmatch(r"([^=:]+)(?:=([^:]*))?(?::(NoSchedule|PreferNoSchedule|NoExecute))?", spec)
    if not match:
        raise UserError(f"--toleration {spec!r}: use KEY[=VALUE][:NoSchedule|PreferNoSchedule|NoExecute].")
    key, value, effect = match.groups()
    item: dict = {"key": key, "operator": "Equal" if value is not None else "Exists"}
    if value is not None:
        item["value"] = value
    if effect:
        item["effect"] = effect
    return item


def pod_security(args: argparse.Namespace) -> dict:
    """The pod runs as --run-as (the image's own non-root user by default); fsGroup makes the output and cache
    claims writable for it (changed only where the claim's root does not match, not file by file on each start)."""
    match = re.fullmatch(r"(\d+)(?::(\d+))?", args.run_as)
    if not match or int(match.group(1)) == 0:
        raise UserError(f"--run-as {args.run_as!r}: use a non-root UID[:GID], e.g. 1000:1000 (the image's user).")
    uid, gid = int(match.group(1)), int(match.group(2) or match.group(1))
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid, "fsGroup": gid,
            "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip


def container_security(rdma: bool) -> dict:
    """No privilege escalation, no capabilities; IPC_LOCK only with RDMA (NCCL pins its InfiniBand buffers)."""
    capabilities: dict = {"drop": ["ALL"]}
    if rdma:
        capabilities["add"] = ["IPC_LOCK"]
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities}


def pod_template(args: argparse.Namespace, env: EnvFile) -> dict:
    vols, mounts = volumes(args)
    token_vols, token_mounts = token_volume(env, args)
    vols, mounts = vols + token_vols, mounts + token_mounts
    resources: dict = {"requests": {"memory": memory_request(args)}}
    if args.cpus_per_task:
        resources["requests"]["cpu"] = str(args.cpus_per_task)
    if args.gpus_per_node:
        resources["limits"] = {"nvidia.com/gpu": args.gpus_per_node}
    rdma = key_values([args.rdma_resource] if args.rdma_resource else [], "--rdma-resource")
    for name, count in rdma.items():  # the RDMA device plugin's resource; IPC_LOCK lets NCCL pin its IB buffers
        resources.setdefault("limits", {})[name] = int(count) if count.isdigit() else count
        resources.setdefault("requests", {})[name] = resources["limits"][name]
    container = {
        "name": PYTORCHJOB_CONTAINER,
        "image": args.image,
        "imagePullPolicy": "IfNotPresent",  # right for an image pinned by digest; a moving tag stays stale
        # the image's ENTRYPOINT (dumb-init + entrypoint.sh) stays: PID 1 reaps and forwards signals
        "args": ["train"],
        "ports": [{"name": PYTORCHJOB_PORT_NAME, "containerPort": RDZV_PORT}],
        "env": env_items(env, args),
        "resources": resources,
        "volumeMounts": mounts,
    }
    container["securityContext"] = container_security(bool(rdma))
    spec: dict = {
        # SIGTERM -> checkpoint -> exit 143; the kubelet waits this long before SIGKILL.
        "terminationGracePeriodSeconds": args.grace_period,
        "securityContext": pod_security(args),
        "containers": [container],
        "volumes": vols,
    }
    optional = {
        "serviceAccountName": args.service_account,
        "priorityClassName": args.priority_class,
        "nodeSelector": key_values(args.node_selector, "--node-selector") or None,
        "tolerations": [toleration(t) for t in args.toleration] or None,
        "imagePullSecrets": [{"name": name} for name in args.image_pull_secret] or None,
    }
    spec.update({key: value for key, value in optional.items() if value})
    return {"spec": spec}


def run_policy(args: argparse.Namespace) -> dict:
    policy: dict = {
        "backoffLimit": args.backoff_limit if args.backoff_limit is not None else RESTARTS_PER_POD * args.nodes,
        "cleanPodPolicy": "Running",
        # gang scheduling (Volcano, scheduler-plugins): all pods start together or none does
        "schedulingPolicy": {"minAvailable": args.nodes},
    }
    if args.priority_class:
        policy["schedulingPolicy"]["priorityClass"] = args.priority_class
    if args.queue:
        policy["schedulingPolicy"]["queue"] = args.queue
    if args.ttl_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = args.ttl_after_finished
    if args.active_deadline is not None:
        policy["activeDeadlineSeconds"] = args.active_deadline
    return policy


def elastic_range(args: argparse.Namespace) -> tuple[int, int] | None:
    """--elastic MIN:MAX, checked against --nodes (the pods the job starts with)."""
    if not args.elastic:
        return None
    match = re.fullmatch(r"([1-9]\d*):([1-9]\d*)", args.elastic)
    if not match or int(match.group(1)) > int(match.group(2)):
        raise UserError(f"--elastic {args.elastic!r}: use MIN:MAX pods, e.g. 2:8.")
    low, high = int(match.group(1)), int(match.group(2))
    if not low <= args.nodes <= high:
        raise UserError(f"--nodes {args.nodes} is outside --elastic {args.elastic}: start with MIN..MAX pods.")
    return low, high


def pytorchjob(args: argparse.Namespace, env: EnvFile) -> dict:
    template = pod_template(args, env)
    elastic = elastic_range(args)
    # elastic: only Workers, which meet at worker-0's c10d rendezvous (the operator sets PET_NNODES=MIN:MAX)
    replicas = {"Worker": args.nodes} if elastic else {"Master": 1, "Worker": args.nodes - 1}
    specs = {
        role: {"replicas": count, "restartPolicy": "ExitCode", "template": copy.deepcopy(template)}
        for role, count in replicas.items()
        if count
    }
    metadata: dict = {"name": args.job_name, **({"namespace": args.namespace} if args.namespace else {})}
    if args.queue:
        metadata["labels"] = {KUEUE_QUEUE_LABEL: args.queue}
    spec: dict = {"pytorchReplicaSpecs": specs, "runPolicy": run_policy(args)}
    if elastic:
        restarts = args.max_restarts if args.max_restarts is not None else RESTARTS_PER_POD
        spec["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": elastic[0], "maxReplicas": elastic[1],
                                 "maxRestarts": restarts}  # fmt: skip
        spec["runPolicy"]["schedulingPolicy"]["minAvailable"] = elastic[0]
    if args.gpus_per_node:
        spec["nprocPerNode"] = str(args.gpus_per_node)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata, "spec": spec}


def k8s_manifest(args: argparse.Namespace, env: EnvFile) -> str:
    import yaml

    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", args.job_name):
        raise UserError(f"--job-name {args.job_name!r}: use lowercase letters, digits and '-' (at most 40).")
    header = [
        f"# trainkit PyTorchJob: {args.nodes} pod(s) x {args.gpus_per_node} GPU(s). Generated by scripts/cluster.py.",
        "# Needs the Kubeflow training operator. Apply with: kubectl apply -f THIS_FILE",
    ]
    if env.secrets:  # a command for the user's shell: each secret from the user's own environment variable
        literals = " ".join(f'--from-literal={identifier(name, str(env.path))}="${name}"' for name in env.secrets)
        header.append(f"# Secrets first: kubectl create secret generic {comment(sh(args.secret_name))} {literals}")
    if args.nodes > 1 and args.output_pvc:
        claim = comment(args.output_pvc)
        header.append(f"# {claim} must be ReadWriteMany: every pod resumes from the checkpoints in it.")
    # values only through the yaml library: quoted where YAML needs it, read back exactly as given
    documents = [pytorchjob(args, env)]
    if args.vllm_server:  # TRL's vLLM server: a Deployment and a Service beside the job
        header.append(f"# The vLLM generation server ({comment(args.vllm_image)}) starts beside it; unproven here.")
        documents += k8s_documents(args, pod_template(args, env)["spec"])
    body = yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return "\n".join(header) + "\n" + body


def add_arguments(parser: argparse.ArgumentParser) -> None:
    k8s = parser.add_argument_group("Kubernetes")
    for name in ("data", "models", "output", "cache"):
        k8s.add_argument(f"--{name}-pvc", help=f"PersistentVolumeClaim mounted at /{name}")
    k8s.add_argument("--namespace")
    k8s.add_argument(
        "--rdma-resource",
        metavar="NAME=COUNT",
        help="InfiniBand/RDMA device plugin resource per pod, e.g. rdma/ib=1 (adds IPC_LOCK)",
    )
    k8s.add_argument("--secret-name", default="trainkit-secrets", help="Secret holding the .env's secrets")
    k8s.add_argument("--run-as", default=RUN_AS, metavar="UID[:GID]",
                     help=f"non-root user of the pods (default {RUN_AS}, the image's own user)")  # fmt: skip
    k8s.add_argument("--shm-size", default="16Gi", help="size of the memory-backed /dev/shm (added to the request)")
    k8s.add_argument("--grace-period", type=int, default=900, help="seconds between SIGTERM and SIGKILL")
    k8s.add_argument("--backoff-limit", type=int, help=f"pod restarts before the job fails ({RESTARTS_PER_POD}/pod)")
    k8s.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    k8s.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]")
    k8s.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME", help="registry credentials")
    k8s.add_argument("--service-account")
    k8s.add_argument("--priority-class", help="PriorityClass of the pods (and of the gang)")
    k8s.add_argument("--queue", help="Kueue LocalQueue (label kueue.x-k8s.io/queue-name) / Volcano queue")
    k8s.add_argument("--ttl-after-finished", type=int, metavar="S", help="delete the finished job after S seconds")
    k8s.add_argument("--active-deadline", type=int, metavar="S", help="fail the job after S seconds")
    k8s.add_argument(
        "--elastic", metavar="MIN:MAX",
        help="elastic job: MIN..MAX pods, all Workers; the global batch changes with the pod count",
    )  # fmt: skip
