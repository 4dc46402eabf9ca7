"""The `trainer` logger on stderr, as the run and the commands that load a model show it."""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("trainer")


def _not_torchao_kernel_notice(record: logging.LogRecord) -> bool:
    """torchao (TRAIN_PRECISION=fp8) loads, on import, compiled kernels of features trainkit does not use (MX formats,
    CUTLASS for one GPU generation) and warns where one does not load: on the CPU, and on a Python other than the one
    a kernel was built for. Transformers imports torchao whenever it is installed, so every run would start with those
    lines; float8 training is Python on torch.compile and needs none of these kernels."""
    message = str(record.msg)
    return not (message.startswith("Failed to load ") and "torchao" in message)


def setup_logging() -> None:
    """The `trainer` logger on stderr; with several ranks, each line says which rank speaks and only rank 0 informs."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torchao = logging.getLogger("torchao")
    if _not_torchao_kernel_notice not in torchao.filters:
        torchao.addFilter(_not_torchao_kernel_notice)
    prefix = f"[rank {rank}/{world}] " if world > 1 else ""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    if world > 1 and rank == 0:
        log.info(
            "%d processes; rank 0 writes metrics, checkpoints and these logs (other ranks log warnings only)", world
        )
