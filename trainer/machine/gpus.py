"""GPUs on this node and processes per node: the one rule, with the GPU count it needs taken without torch.

The launcher counts GPUs itself (`count_visible_gpus`: it must not import torch or touch the GPUs);
the trainer passes the count torch reports. Both go through `processes_per_node`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping


class NprocError(ValueError):
    """A process count that cannot work on this node; the message names the setting and the fix."""


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


def processes_per_node(
    requested: str, gpus: int, gpu_reason: str, source: str = "TRAIN_NPROC_PER_NODE"
) -> tuple[int, str]:
    """(processes, reason) for `requested` (auto or a count) on a node with `gpus` GPUs (0: CPU)."""
    value = requested.strip().lower()
    if value == "auto":
        if gpus:
            return gpus, f"auto: one per visible GPU ({gpu_reason})"
        return 1, f"auto: 1, training on CPU ({gpu_reason})"
    if not re.fullmatch(r"[1-9]\d*", value):
        raise NprocError(f"{source}={requested!r}: use auto or a whole number of processes per node, e.g. 8.")
    nproc = int(value)
    if gpus and nproc > gpus:
        raise NprocError(
            f"{source}={nproc} but only {gpus} GPU(s) are visible ({gpu_reason}); "
            f"use at most {gpus}, or auto for one process per GPU."
        )
    return nproc, f"set by {source}={nproc}"


def resolve_nproc(env: Mapping[str, str]) -> tuple[int, str]:
    """The launcher's count: TRAIN_NPROC_PER_NODE, else the operator's PET_NPROC_PER_NODE, else auto."""
    requested, source = env.get("TRAIN_NPROC_PER_NODE", "").strip() or "auto", "TRAIN_NPROC_PER_NODE"
    if requested.lower() == "auto" and env.get("PET_NPROC_PER_NODE", "").strip().isdigit():
        requested, source = env["PET_NPROC_PER_NODE"].strip(), "PET_NPROC_PER_NODE"
    gpus, gpu_reason = count_visible_gpus(env)
    return processes_per_node(requested, gpus, gpu_reason, source)
