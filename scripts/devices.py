"""What this host hands to a training container: NVIDIA GPUs (through the engine's NVIDIA runtime) and
InfiniBand/RDMA devices (/dev/infiniband, which NCCL's IB transport needs, with IPC_LOCK to pin its buffers)."""

from __future__ import annotations

from pathlib import Path

import docker
from docker.types import DeviceRequest

INFINIBAND = Path("/dev/infiniband")


def engine_has_gpus(client: docker.DockerClient) -> bool:
    """The engine can hand GPUs to containers: the NVIDIA runtime (Container Toolkit) is registered."""
    return "nvidia" in (client.info().get("Runtimes") or {})


def device_requests(gpus: str) -> list[DeviceRequest]:
    if gpus == "none":
        return []
    return [DeviceRequest(count=-1 if gpus == "all" else int(gpus), capabilities=[["gpu"]])]


def rdma_passthrough(infiniband: Path = INFINIBAND) -> dict[str, list[str]]:
    """Host-config arguments that pass the RDMA devices through where the host has them; nothing elsewhere."""
    if not infiniband.is_dir():
        return {}
    return {"devices": [f"{infiniband}:{infiniband}:rwm"], "cap_add": ["IPC_LOCK"]}
