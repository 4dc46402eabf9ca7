"""Where this node sits in the job, from the variables its scheduler set (torchrun, Kubeflow, Slurm)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import hostlist

DEFAULT_RDZV_PORT = 29400
DEFAULT_MASTER_PORT = 29500
# Slurm jobs rendezvous on 20000-29999: below Linux's ephemeral ports (32768+), which outgoing connections take.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 10000


class LaunchError(Exception):
    """A placement the user (or the scheduler's setup) got wrong: one message, exit 2."""


@dataclass
class Placement:
    """Where this node sits in the job."""

    source: str
    nnodes: str = "1"
    node_rank: int | None = None
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str | None = None
    rdzv_id: str = "trainkit"
    rdzv_conf: list[str] = field(default_factory=list)

    @property
    def single_node(self) -> bool:
        return self.nnodes == "1"


# ---------------------------------------------------------------- placement


def int_var(env: Mapping[str, str], name: str) -> int:
    value = env[name].strip()
    if not re.fullmatch(r"\d+", value):
        raise LaunchError(f"{name}={value!r} is not a whole number; set it to e.g. {name}=2.")
    return int(value)


def _nnodes_var(env: Mapping[str, str], name: str) -> str:
    value = env[name].strip()
    if not re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", value):
        raise LaunchError(f"{name}={value!r} must be a node count like 2, or a range like 1:4.")
    return value


def _with_port(endpoint: str, default_port: int) -> str:
    return endpoint if re.search(r":\d+$", endpoint) else f"{endpoint}:{default_port}"


def _endpoint_from(env: Mapping[str, str], prefix: str) -> str | None:
    """{prefix}RDZV_ENDPOINT, else {prefix}MASTER_ADDR:{prefix}MASTER_PORT."""
    if env.get(prefix + "RDZV_ENDPOINT"):
        return _with_port(env[prefix + "RDZV_ENDPOINT"].strip(), DEFAULT_RDZV_PORT)
    if env.get(prefix + "MASTER_ADDR"):
        port = int_var(env, prefix + "MASTER_PORT") if env.get(prefix + "MASTER_PORT") else DEFAULT_MASTER_PORT
        return f"{env[prefix + 'MASTER_ADDR'].strip()}:{port}"
    return None


def _from_torchrun_vars(env: Mapping[str, str], prefix: str, source: str) -> Placement:
    placement = Placement(source=source, nnodes=_nnodes_var(env, prefix + "NNODES"))
    if env.get(prefix + "NODE_RANK"):
        placement.node_rank = int_var(env, prefix + "NODE_RANK")
    placement.rdzv_endpoint = _endpoint_from(env, prefix)
    placement.rdzv_backend = env.get(prefix + "RDZV_BACKEND", "").strip() or "c10d"
    placement.rdzv_id = (
        env.get(prefix + "RDZV_ID", "").strip() or env.get(prefix + "MASTER_ADDR", "").strip() or "trainkit"
    )
    if env.get(prefix + "RDZV_CONF"):
        placement.rdzv_conf = [item for item in env[prefix + "RDZV_CONF"].split(",") if item]
    if not placement.single_node and not placement.rdzv_endpoint:
        raise LaunchError(
            f"{prefix}NNODES={placement.nnodes} but no rendezvous address: set {prefix}RDZV_ENDPOINT=host:port "
            f"(the same on every node, e.g. the first node's name) or {prefix}MASTER_ADDR."
        )
    if placement.rdzv_backend == "static" and placement.node_rank is None and not placement.single_node:
        raise LaunchError(f"{prefix}RDZV_BACKEND=static needs {prefix}NODE_RANK (0 on the first node).")
    return placement


def _slurm_var(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if env.get(name, "").strip():
            return name
    return None


def _from_slurm(env: Mapping[str, str]) -> Placement:
    nnodes_name = _slurm_var(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    nodelist_name = _slurm_var(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if nnodes_name is None or nodelist_name is None:
        raise LaunchError("inside a Slurm job (SLURM_JOB_ID is set) but SLURM_NNODES or SLURM_JOB_NODELIST is missing.")
    nnodes = int_var(env, nnodes_name)
    placement = Placement(source="Slurm", nnodes=str(nnodes), rdzv_id=env["SLURM_JOB_ID"].strip())
    if env.get("SLURM_NODEID", "").strip():
        placement.node_rank = int_var(env, "SLURM_NODEID")
    if nnodes > 1:
        _check_slurm_tasks(env, nnodes)
        host = first_host(env[nodelist_name], nodelist_name)
        placement.rdzv_endpoint = f"{host}:{slurm_rdzv_port(int_var(env, 'SLURM_JOB_ID'))}"
    return placement


def slurm_rdzv_port(job_id: int) -> int:
    """The rendezvous port of a Slurm job: derived from its ID, so two jobs whose first node is the same do not
    collide (a fixed port does). MASTER_PORT is not read here: enroot's PyTorch hook sets it inside the container."""
    return SLURM_PORT_BASE + job_id % SLURM_PORT_SPAN


def _check_slurm_tasks(env: Mapping[str, str], nnodes: int) -> None:
    """One launcher per node: Slurm must start one task per node, not one per GPU."""
    if not env.get("SLURM_STEP_ID", "").strip() and not env.get("SLURM_PROCID", "").strip():
        raise LaunchError(
            f"this Slurm job has {nnodes} nodes but the launcher runs outside `srun`; start it with "
            "`srun --ntasks-per-node=1 ...` so that every node runs it once."
        )
    tasks_name = _slurm_var(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if tasks_name and int_var(env, tasks_name) != nnodes:
        raise LaunchError(
            f"{tasks_name}={env[tasks_name]} tasks on {nnodes} nodes: the launcher starts one process per GPU "
            "itself, so run exactly one task per node (`srun --ntasks-per-node=1`)."
        )


def _from_legacy_kubeflow(env: Mapping[str, str]) -> Placement:
    placement = Placement(
        source="Kubeflow PyTorchJob (WORLD_SIZE/RANK)",
        nnodes=str(int_var(env, "WORLD_SIZE")),
        node_rank=int_var(env, "RANK"),
        rdzv_endpoint=_endpoint_from(env, ""),
        rdzv_id=env["MASTER_ADDR"].strip(),
    )
    return placement


def detect_placement(env: Mapping[str, str]) -> Placement:
    """Which scheduler placed this node, and where the others are."""
    if env.get("NNODES", "").strip():
        return _from_torchrun_vars(env, "", "torchrun variables")
    if env.get("PET_NNODES", "").strip():
        return _from_torchrun_vars(env, "PET_", "Kubeflow PyTorchJob / PET_* variables")
    if env.get("SLURM_JOB_ID", "").strip():
        return _from_slurm(env)
    if env.get("WORLD_SIZE", "").strip() and env.get("RANK", "").strip() and env.get("MASTER_ADDR", "").strip():
        return _from_legacy_kubeflow(env)
    return Placement(source="single node (no scheduler variables)")


def first_host(nodelist: str, name: str) -> str:
    """The first host of a Slurm hostlist (`gpu-a[07-08],gpu-b3` -> gpu-a07), with python-hostlist."""
    try:
        hosts = hostlist.expand_hostlist(nodelist.strip())
    except hostlist.BadHostlist as exc:
        raise LaunchError(f"{name}={nodelist!r} is not a Slurm hostlist: {exc}.") from None
    if not hosts or not hosts[0].strip():
        raise LaunchError(f"{name}={nodelist!r} names no host.")
    return hosts[0]
