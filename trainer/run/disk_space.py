"""A full disk ends the run with exit 2 and where it is full, never with a traceback or a half-written checkpoint.

A failed save is classified by trainer/machine/disk.py (its cause chain, else a write probe where it wrote). The
partial staging folder is removed (the last complete checkpoint and metrics.jsonl stay as they were), and the run
ends with `DiskFull` (a ConfigError: exit 2, "error: ..."), so a restart policy does not retry into the same wall.

At start, `warn_if_too_small` estimates a checkpoint's size from the model (weights + Adam's two moments per
trainable parameter) and warns when the output folder's free space cannot hold two (the staged one and the last
complete one).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.errors import ConfigError
from trainer.machine.disk import disk_cause, free_text, why_refused

if TYPE_CHECKING:
    from torch.nn import Module

log = logging.getLogger("trainer")


class DiskFull(ConfigError):
    """The filesystem under `folder` refused a write: full, over quota or read-only."""

    def __init__(self, folder: Path, cause: OSError, what: str) -> None:
        self.folder = folder
        super().__init__(
            f"the filesystem holding {folder} {why_refused(cause)} ({cause.strerror}) while {what}. "
            f"{free_text(folder)}"
            "The last complete checkpoint and metrics.jsonl are intact: free space (or give TRAIN_OUTPUT_DIR a "
            "larger filesystem, or lower TRAIN_SAVE_TOTAL_LIMIT) and start the run again to resume"
        )


@contextlib.contextmanager
def full_disk_ends_run(folder: Path, what: str, staging: Path | None = None) -> Iterator[None]:
    """Inside: a write that fails for lack of space removes `staging` and raises DiskFull naming `folder`."""
    try:
        yield
    except ConfigError:  # DiskFull itself, or a user mistake: nothing to do with space
        raise
    except Exception as exc:
        cause = disk_cause(exc, folder if folder.is_dir() else None)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if cause is None:
            raise
        log.error("disk: %s while %s; removed the partial %s", cause.strerror, what, staging or "write")
        raise DiskFull(folder, cause, what) from None


def checkpoint_bytes(model: Module) -> int:
    """About what one checkpoint takes: the weights as stored, plus two fp32 Adam moments per trainable weight."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    saved = trainable if hasattr(model, "peft_config") else list(model.parameters())  # LoRA saves its adapter only
    return int(sum(p.numel() * p.element_size() for p in saved) + 8 * sum(p.numel() for p in trainable))


def warn_if_too_small(output_dir: Path, model: Module) -> None:
    """A warning at start when the output folder's free space cannot hold two checkpoints."""
    try:
        free = shutil.disk_usage(output_dir).free
    except OSError:
        return
    need = checkpoint_bytes(model)
    if free < 2 * need:
        log.warning(
            "disk: %s has %.0f MiB free, and a checkpoint takes about %.0f MiB: a save needs room for two (the new "
            "one beside the last complete one), so a save will likely fail for lack of space",
            output_dir, free / 2**20, need / 2**20,
        )  # fmt: skip
