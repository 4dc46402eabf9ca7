"""The `trainer` logger on stderr, as the run and the commands that load a model show it."""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("trainer")


def setup_logging() -> None:
    """The `trainer` logger on stderr; with several ranks, each line says which rank speaks and only rank 0 informs."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
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
