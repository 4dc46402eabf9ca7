"""The launcher behind the image's `train` command: one process, or torchrun across GPUs and nodes.

`python -m trainer.launch [--dry-run] [COMMAND] [ARGS...]` decides the placement from the environment
the scheduler set, then either execs `python -m trainer COMMAND` (one node, one process: no torchrun
overhead) or runs torchrun with a c10d rendezvous. Placement sources, first match wins:

1. torchrun's variables: NNODES, NODE_RANK, RDZV_ENDPOINT / RDZV_ID / RDZV_BACKEND, MASTER_ADDR / MASTER_PORT;
2. torchrun's PET_* variables, which the Kubeflow training operator sets for a PyTorchJob
   (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE, PET_RDZV_*, PET_MAX_RESTARTS);
3. Slurm's: SLURM_JOB_ID, SLURM_STEP_NUM_NODES / SLURM_NNODES, SLURM_NODEID, SLURM_STEP_NODELIST / SLURM_JOB_NODELIST;
4. older Kubeflow operators: WORLD_SIZE (pods) and RANK with MASTER_ADDR.

Only `train` is distributed; other trainer commands (config, doctor, bench) run as one process.
Never imports torch: the decision must be quick and must not touch the GPUs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from trainer.hostlist import HostlistError, first_host

DEFAULT_RDZV_PORT = 29400
DEFAULT_MASTER_PORT = 29500
DISTRIBUTED_COMMANDS = {"train"}
TRAINER_COMMANDS = {"train", "config", "doctor", "bench"}
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")

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


@dataclass
class Decision:
    """What the launcher will run, and why."""

    placement: Placement
    nproc_per_node: int
    nproc_reason: str
    max_restarts: int
    command: list[str]
    env: dict[str, str]
    distributed: bool


# ---------------------------------------------------------------- placement


def _int_var(env: Mapping[str, str], name: str) -> int:
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
        port = _int_var(env, prefix + "MASTER_PORT") if env.get(prefix + "MASTER_PORT") else DEFAULT_MASTER_PORT
        return f"{env[prefix + 'MASTER_ADDR'].strip()}:{port}"
    return None


def _from_torchrun_vars(env: Mapping[str, str], prefix: str, source: str) -> Placement:
    placement = Placement(source=source, nnodes=_nnodes_var(env, prefix + "NNODES"))
    if env.get(prefix + "NODE_RANK"):
        placement.node_rank = _int_var(env, prefix + "NODE_RANK")
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
    nnodes = _int_var(env, nnodes_name)
    placement = Placement(source="Slurm", nnodes=str(nnodes), rdzv_id=env["SLURM_JOB_ID"].strip())
    if env.get("SLURM_NODEID", "").strip():
        placement.node_rank = _int_var(env, "SLURM_NODEID")
    if nnodes > 1:
        _check_slurm_tasks(env, nnodes)
        try:
            host = first_host(env[nodelist_name])
        except HostlistError as exc:
            raise LaunchError(f"{nodelist_name}: {exc}") from None
        port = _int_var(env, "MASTER_PORT") if env.get("MASTER_PORT") else DEFAULT_RDZV_PORT
        placement.rdzv_endpoint = f"{host}:{port}"
    return placement


def _check_slurm_tasks(env: Mapping[str, str], nnodes: int) -> None:
    """One launcher per node: Slurm must start one task per node, not one per GPU."""
    if not env.get("SLURM_STEP_ID", "").strip() and not env.get("SLURM_PROCID", "").strip():
        raise LaunchError(
            f"this Slurm job has {nnodes} nodes but the launcher runs outside `srun`; start it with "
            "`srun --ntasks-per-node=1 ...` so that every node runs it once."
        )
    tasks_name = _slurm_var(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if tasks_name and _int_var(env, tasks_name) != nnodes:
        raise LaunchError(
            f"{tasks_name}={env[tasks_name]} tasks on {nnodes} nodes: the launcher starts one process per GPU "
            "itself, so run exactly one task per node (`srun --ntasks-per-node=1`)."
        )


def _from_legacy_kubeflow(env: Mapping[str, str]) -> Placement:
    placement = Placement(
        source="Kubeflow PyTorchJob (WORLD_SIZE/RANK)",
        nnodes=str(_int_var(env, "WORLD_SIZE")),
        node_rank=_int_var(env, "RANK"),
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


# ---------------------------------------------------------------- processes per node


def count_visible_gpus(env: Mapping[str, str]) -> tuple[int, str]:
    """GPUs this node may use, without importing torch: CUDA_VISIBLE_DEVICES, else nvidia-smi -L, else /dev."""
    if "CUDA_VISIBLE_DEVICES" in env:
        value = env["CUDA_VISIBLE_DEVICES"].strip()
        devices = [d for d in value.split(",") if d.strip() and d.strip() not in ("-1", "NoDevFiles")]
        return len(devices), f"CUDA_VISIBLE_DEVICES={value!r}"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            listing = ""
        gpus = [line for line in listing.splitlines() if line.startswith("GPU ")]
        migs = [line for line in listing.splitlines() if line.strip().startswith("MIG ")]
        if migs:
            return len(migs), "MIG devices listed by nvidia-smi -L"
        if gpus:
            return len(gpus), "GPUs listed by nvidia-smi -L"
    nodes = [name for name in _list_dev() if re.fullmatch(r"nvidia\d+", name)]
    if nodes:
        return len(nodes), "/dev/nvidiaN device files"
    return 0, "no GPU visible"


def _list_dev() -> list[str]:
    try:
        return os.listdir("/dev")
    except OSError:
        return []


def resolve_nproc(env: Mapping[str, str], requested: str) -> tuple[int, str]:
    """Processes per node: TRAIN_NPROC_PER_NODE, else PET_NPROC_PER_NODE, else one per visible GPU (1 on CPU)."""
    gpus, gpu_reason = count_visible_gpus(env)
    source = "TRAIN_NPROC_PER_NODE"
    if requested.strip().lower() == "auto" and env.get("PET_NPROC_PER_NODE", "").strip().isdigit():
        requested, source = env["PET_NPROC_PER_NODE"].strip(), "PET_NPROC_PER_NODE"
    if requested.strip().lower() == "auto":
        if gpus:
            return gpus, f"one per visible GPU ({gpu_reason})"
        return 1, f"1: {gpu_reason}, training on CPU"
    if not re.fullmatch(r"[1-9]\d*", requested.strip()):
        raise LaunchError(f"{source}={requested!r}: use auto or a whole number of processes per node, e.g. 8.")
    nproc = int(requested)
    if gpus and nproc > gpus:
        raise LaunchError(
            f"{source}={nproc} but only {gpus} GPU(s) are visible ({gpu_reason}); "
            f"use at most {gpus}, or auto for one process per GPU."
        )
    return nproc, f"{source}={nproc}"


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


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for torchrun and its workers: the caller's, plus fail-fast defaults."""
    merged = dict(env)
    for name, value in WORKER_ENV_DEFAULTS.items():
        merged.setdefault(name, value)
    return merged


def mask_args(args: Sequence[str]) -> list[str]:
    """Hide the value after (or in) any flag naming a token, key, secret or password."""
    masked, hide_next = [], False
    for arg in args:
        secret_flag = any(word in arg.upper() for word in SECRET_WORDS) and arg.startswith("-")
        if hide_next:
            masked.append("***")
        elif secret_flag and "=" in arg:
            masked.append(arg.split("=", 1)[0] + "=***")
        else:
            masked.append(arg)
        hide_next = secret_flag and "=" not in arg
    return masked


# ---------------------------------------------------------------- settings


def _launch_settings(env: Mapping[str, str]) -> tuple[int, int]:
    """max_restarts and rdzv_timeout. Every torch-free check of the trainer (TRAIN_* names and values, data, output
    folder) runs here first, so a mistake is one message and exit 2 instead of one per worker and restart."""
    from trainer.config import load_settings
    from trainer.errors import ConfigError

    try:
        settings = load_settings(env)
    except ConfigError as exc:
        raise LaunchError(exc.message) from None
    max_restarts = settings.max_restarts
    if "TRAIN_MAX_RESTARTS" not in env and env.get("PET_MAX_RESTARTS", "").strip():
        max_restarts = _int_var(env, "PET_MAX_RESTARTS")
    return max_restarts, settings.rdzv_timeout


def decide(command: str, args: Sequence[str], env: Mapping[str, str]) -> Decision:
    """The full launch decision for `python -m trainer.launch command args` in this environment."""
    python = sys.executable or "python3"
    trainer_cmd = ["-m", "trainer", command, *args]
    inside_torchrun = "TORCHELASTIC_RUN_ID" in env or "LOCAL_RANK" in env
    if command not in DISTRIBUTED_COMMANDS or inside_torchrun:
        why = "already a torchrun worker" if inside_torchrun else f"`{command}` runs as one process"
        return Decision(Placement(source=why), 1, why, 0, [python, *trainer_cmd], dict(env), False)
    placement = detect_placement(env)
    nproc, nproc_reason = resolve_nproc(env, env.get("TRAIN_NPROC_PER_NODE", "auto"))
    if placement.single_node and nproc == 1:
        # the trainer checks its settings itself within a second; no need to do it twice
        return Decision(placement, 1, nproc_reason, 0, [python, *trainer_cmd], dict(env), False)
    max_restarts, rdzv_timeout = _launch_settings(env)
    run = [python, "-m", "torch.distributed.run", *torchrun_args(placement, nproc, max_restarts, rdzv_timeout)]
    return Decision(placement, nproc, nproc_reason, max_restarts, [*run, *trainer_cmd], worker_env(env), True)


def describe(decision: Decision) -> str:
    """Two lines for the log: the placement and the command (secrets masked)."""
    p = decision.placement
    if decision.distributed:
        where = f"{p.nnodes} node(s) x {decision.nproc_per_node} process(es)"
        rank = f", node rank {p.node_rank}" if p.node_rank is not None else ""
        rdzv = "standalone" if p.single_node else f"{p.rdzv_backend} rendezvous at {p.rdzv_endpoint} id {p.rdzv_id}"
        restarts = f"max restarts {decision.max_restarts}"
        head = f"{p.source}: {where}{rank}; {rdzv}; {restarts}; nproc: {decision.nproc_reason}"
    else:
        head = f"{p.source}: one process ({decision.nproc_reason})"
    return f"trainkit launch: {head}\ntrainkit launch: {' '.join(mask_args(decision.command))}"


# ---------------------------------------------------------------- run


def run_torchrun(decision: Decision) -> int:
    """Run torchrun as a child, forward stop signals to it, and map the outcome to the trainer's exit codes
    (torchrun itself exits 1 for any failed worker, also after a SIGTERM the workers answered with 143)."""
    received: list[int] = []
    child: subprocess.Popen | None = None

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for sig in FORWARDED_SIGNALS:  # before the child exists: a stop signal must never orphan torchrun
        signal.signal(sig, forward)
    child = subprocess.Popen(decision.command, env=decision.env)
    if received and child.poll() is None:
        child.send_signal(received[0])
    code = child.wait()
    if code != 0 and received:
        return 128 + received[0]
    return 128 - code if code < 0 else code


def parse_cli(argv: Sequence[str]) -> tuple[bool, bool, str, list[str]]:
    """[--dry-run [--json]] [COMMAND (default train)] [--dry-run [--json]] ARGS...

    The dry run may also follow the command (the entrypoint passes `train --dry-run`); a `--json` after the
    command belongs to the command (`doctor --json`) unless it follows `--dry-run`."""
    rest = list(argv)
    if rest and rest[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    dry_run = json_out = False

    def take_dry_run() -> None:
        nonlocal dry_run, json_out
        if rest and rest[0] == "--dry-run":
            del rest[0]
            dry_run = True
            if rest and rest[0] == "--json":
                del rest[0]
                json_out = True

    take_dry_run()
    command = rest.pop(0) if rest and rest[0] in TRAINER_COMMANDS else "train"
    take_dry_run()
    return dry_run, json_out, command, rest


def main(argv: Sequence[str] | None = None) -> int:
    dry_run, json_out, command, args = parse_cli(sys.argv[1:] if argv is None else argv)
    try:
        decision = decide(command, args, os.environ)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(decision), file=sys.stderr, flush=True)
    if dry_run:
        if json_out:
            added = {k: v for k, v in decision.env.items() if os.environ.get(k) != v}
            report = {**asdict(decision), "env": added, "command": mask_args(decision.command)}
            print(json.dumps(report, indent=2))
        return 0
    if not decision.distributed:
        os.execve(decision.command[0], decision.command, decision.env)
    return run_torchrun(decision)


if __name__ == "__main__":
    sys.exit(main())
