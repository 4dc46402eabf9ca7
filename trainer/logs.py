"""The `trainer` logger on stderr, as the run and the commands that load a model show it."""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("trainer")


# Import-time notices of libraries that are not the user's to act on: {logger: a text its record holds}. torchao
# (TRAIN_PRECISION=fp8; Transformers imports it whenever it is installed, so every run) loads compiled kernels of
# features trainkit does not use (MX formats, CUTLASS for one GPU generation) and warns where one does not load: on the
# CPU, and on a Python other than the one a kernel was built for; float8 training is Python on torch.compile and needs
# none of them. torch 2.13 tells torchao, on the same import, that registering its enums is deprecated.
LIBRARY_NOTICES = {"torchao": "Failed to load ", "torch.utils._pytree": "is an Enum subclass"}


def _not_a_library_notice(record: logging.LogRecord) -> bool:
    return LIBRARY_NOTICES.get(record.name, "\0") not in record.getMessage()


def setup_logging() -> None:
    """The `trainer` logger on stderr; with several ranks, each line says which rank speaks and only rank 0 informs."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    for name in LIBRARY_NOTICES:
        if _not_a_library_notice not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_not_a_library_notice)
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
