"""A full disk ends the run with exit 2 and where it is full, never with a traceback or a half-written checkpoint.

ENOSPC, EDQUOT and EROFS reach us as an OSError from Python's own writes (metrics, run_config.json, data shards), but
torch.save reports them as `RuntimeError: ... unexpected pos` and safetensors as its own error. So a failed save
is classified by its cause chain first and, failing that, by a probe: writing one MiB where the save wrote. The
partial staging folder is removed (the last complete checkpoint and metrics.jsonl stay as they were), and the run
ends with `DiskFull` (a ConfigError: exit 2, "error: ..."), so a restart policy does not retry into the same wall.

At start, `warn_if_too_small` estimates a checkpoint's size from the model (weights + Adam's two moments per
trainable parameter) and warns when the output folder's free space cannot hold two (the staged one and the last
complete one).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.errors import ConfigError

if TYPE_CHECKING:
    from torch.nn import Module

log = logging.getLogger("trainer")

DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
PROBE_BYTES = 1 << 20


class DiskFull(ConfigError):
    """The filesystem under `folder` refused a write: full, over quota or read-only."""

    def __init__(self, folder: Path, cause: OSError, what: str) -> None:
        self.folder = folder
        why = {errno.EROFS: "is read-only", errno.EDQUOT: "is over its disk quota"}.get(cause.errno or 0, "is full")
        super().__init__(
            f"the filesystem holding {folder} {why} ({cause.strerror}) while {what}. {_free(folder)}"
            "The last complete checkpoint and metrics.jsonl are intact: free space (or give TRAIN_OUTPUT_DIR a "
            "larger filesystem, or lower TRAIN_SAVE_TOTAL_LIMIT) and start the run again to resume"
        )


def disk_cause(exc: BaseException, folder: Path | None = None) -> OSError | None:
    """The ENOSPC/EDQUOT/EROFS behind `exc`: from its cause chain, else from a write probe in `folder`."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_ERRNOS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return _probe(folder) if folder is not None else None


def _probe(folder: Path) -> OSError | None:
    probe = folder / f".trainkit-space-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        return exc if exc.errno in DISK_ERRNOS else None
    try:
        os.write(fd, b"\0" * PROBE_BYTES)
        os.fsync(fd)
    except OSError as exc:
        return exc if exc.errno in DISK_ERRNOS else None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


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


def _free(folder: Path) -> str:
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return ""
    return f"Free there now: {usage.free / 2**20:.0f} MiB of {usage.total / 2**20:.0f} MiB. "


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
