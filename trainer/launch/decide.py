"""What the launcher runs: the trainer directly, or torchrun with the options for this placement."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainer import compat
from trainer.commands import names
from trainer.launch.placement import LaunchError, Placement, detect_placement, int_var
from trainer.lifetime import TORCHRUN_MARKER
from trainer.machine.gpus import NprocError, resolve_nproc
from trainer.machine.threads import thread_env
from trainer.secrets import mask_args

DISTRIBUTED_COMMANDS = frozenset(names(distributed=True))  # run under torchrun across GPUs and nodes
TRAINER_COMMANDS = frozenset(names())  # `python -m trainer.launch COMMAND`: any other first word is train's

# Set for the workers unless the user set them: a failed or hung collective must end the job.
WORKER_ENV_DEFAULTS = {
    # The NCCL watchdog aborts the communicator and ends the process when a collective errors or
    # exceeds the process-group timeout (Transformers' --ddp_timeout, 1800 s unless TRAIN_ARGS says otherwise).
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # If the watchdog itself is stuck, the heartbeat monitor kills the process (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC).
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    # Time torchrun gives workers after SIGTERM (they write a checkpoint) before SIGKILL.
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "300",
    # Every worker line starts with its global rank.
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:",
    "PYTHONUNBUFFERED": "1",
}


# A torchrun worker's own variables. Set outside torchrun (enroot's 50-slurm-pytorch.sh hook exports them into
# every image with PYTORCH_VERSION, as NGC's) they would make each worker think it is rank 0 of a one-process job;
# the launcher clears them and torchrun sets them per worker. Only TORCHRUN_MARKER means "inside torchrun".
WORKER_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class LaunchPlan:
    """What the launcher will run, and why."""

    placement: Placement
    nproc_per_node: int
    nproc_reason: str
    max_restarts: int
    command: list[str]
    env: dict[str, str]
    distributed: bool
    cleared: list[str] = field(default_factory=list)  # worker variables set outside torchrun, removed from env
    supervised: bool = False  # the launcher stays the parent and delivers stops (trainer.launch.supervise)


# ---------------------------------------------------------------- command


def torchrun_args(placement: Placement, nproc: int, max_restarts: int, rdzv_timeout: int) -> list[str]:
    """torchrun's options for this placement."""
    args = ["--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts), "--tee", "3"]
    if placement.single_node and placement.rdzv_backend != "static":
        return ["--standalone", "--nnodes", "1", *args]
    args = ["--nnodes", placement.nnodes, *args]
    if placement.rdzv_backend == "static":
        host, _, port = (placement.rdzv_endpoint or "127.0.0.1:29500").rpartition(":")
        return [*args, "--node-rank", str(placement.node_rank or 0), "--master-addr", host, "--master-port", port]
    conf = {"join_timeout": str(rdzv_timeout), "read_timeout": "60"}
    for item in placement.rdzv_conf:
        key, _, value = item.partition("=")
        conf[key.strip()] = value.strip()
    return [
        *args,
        "--rdzv-backend", placement.rdzv_backend,
        "--rdzv-endpoint", placement.rdzv_endpoint or "",
        "--rdzv-id", placement.rdzv_id,
        "--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items()),
    ]  # fmt: skip


def without_worker_variables(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(env without WORKER_VARIABLES, the names removed)."""
    cleared = [name for name in WORKER_VARIABLES if name in env]
    return {k: v for k, v in env.items() if k not in WORKER_VARIABLES}, cleared


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for torchrun and its workers: the caller's, plus fail-fast defaults."""
    merged = dict(env)
    for name, value in WORKER_ENV_DEFAULTS.items():
        merged.setdefault(name, value)
    return merged


# ---------------------------------------------------------------- settings


def _launch_settings(env: Mapping[str, str]) -> tuple[int, int, bool]:
    """max_restarts, rdzv_timeout, and whether Hub IDs were fetched. Every torch-free check of the trainer (TRAIN_*
    names and values, data, output folder, Hub IDs: downloaded here, once per node) runs here first, so a mistake is
    one message and exit 2 instead of one per worker and restart."""
    from trainer.config import load_inputs
    from trainer.errors import ConfigError

    try:
        inputs = load_inputs(env)
    except ConfigError as exc:
        raise LaunchError(exc.message) from None
    settings = inputs.settings
    max_restarts = settings.max_restarts
    if "TRAIN_MAX_RESTARTS" not in env and env.get("PET_MAX_RESTARTS", "").strip():
        max_restarts = int_var(env, "PET_MAX_RESTARTS")
    return max_restarts, settings.rdzv_timeout, bool(inputs.hub.snapshots())


def decide(command: str, args: Sequence[str], env: Mapping[str, str]) -> LaunchPlan:
    """The full launch plan for `python -m trainer.launch command args` in this environment."""
    python = sys.executable or "python3"
    trainer_cmd = ["-m", "trainer", command, *args]
    inside_torchrun = TORCHRUN_MARKER in env
    if command not in DISTRIBUTED_COMMANDS or inside_torchrun:
        why = "already a torchrun worker" if inside_torchrun else f"`{command}` runs as one process"
        return LaunchPlan(Placement(source=why), 1, why, 0, [python, *trainer_cmd], dict(env), False)
    placement = detect_placement(env)
    try:
        nproc, nproc_reason = resolve_nproc(env)
    except NprocError as exc:
        raise LaunchError(str(exc)) from None
    clean, cleared = without_worker_variables(env)
    if placement.single_node and nproc == 1:
        # the trainer checks its settings itself within a second; no need to do it twice
        return LaunchPlan(placement, 1, nproc_reason, 0, [python, *trainer_cmd], clean, False, cleared, supervised=True)
    max_restarts, rdzv_timeout, fetched = _launch_settings(env)
    if fetched:  # the workers (and their restarts) read the node's cache: same commits, no Hub calls per rank
        clean["HF_HUB_OFFLINE"] = "1"
    run = [python, "-m", "torch.distributed.run", *torchrun_args(placement, nproc, max_restarts, rdzv_timeout)]
    command_line = [*run, *trainer_cmd]
    workers = worker_env(clean)
    workers.update(thread_env(workers, nproc)[0])  # torchrun would give each worker one thread
    return LaunchPlan(
        placement, nproc, nproc_reason, max_restarts, command_line, workers, True, cleared, supervised=True
    )


def torchrun_stop_note(env: Mapping[str, str]) -> str:
    """What torchrun does with a SIGTERM it hears itself, for this torch (read without importing it)."""
    version = compat.installed_version("torch")
    if version is None:
        return "torch not installed"
    if not compat.stack().torchrun_stop_wait_configurable:
        return f"torch {version}: torchrun's own stop wait is a fixed 30 s; stops go to the trainer processes"
    wait = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
    return f"torch {version}: torchrun's own stop wait is {wait} s; stops go to the trainer processes"


def describe(plan: LaunchPlan) -> str:
    """Two lines for the log: the placement and the command (secrets masked)."""
    p = plan.placement
    if plan.distributed:
        where = f"{p.nnodes} node(s) x {plan.nproc_per_node} process(es)"
        rank = f", node rank {p.node_rank}" if p.node_rank is not None else ""
        rdzv = "standalone" if p.single_node else f"{p.rdzv_backend} rendezvous at {p.rdzv_endpoint} id {p.rdzv_id}"
        restarts = f"max restarts {plan.max_restarts}"
        head = f"{p.source}: {where}{rank}; {rdzv}; {restarts}; nproc: {plan.nproc_reason}"
        head += f"; {torchrun_stop_note(plan.env)}"
    else:
        head = f"{p.source}: one process ({plan.nproc_reason})"
    if plan.cleared:
        head += f"; ignored {', '.join(plan.cleared)} (set outside torchrun: torchrun sets them per worker)"
    return f"trainkit launch: {head}\ntrainkit launch: {' '.join(mask_args(plan.command))}"
