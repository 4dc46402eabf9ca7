"""Is a failed write a full disk? The one rule, for the run (trainer/run/disk_space.py) and export.

ENOSPC, EDQUOT and EROFS reach us as an OSError from Python's own writes, but torch.save reports them as
`RuntimeError: ... unexpected pos`, safetensors as its own error and a child process (llama.cpp's converter) only by
its exit code. So a failure is classified by its cause chain first and, failing that, by a probe: writing one MiB
where the failed write went.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
PROBE_BYTES = 1 << 20


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


def why_refused(cause: OSError) -> str:
    """"is full", "is over its disk quota" or "is read-only"."""
    return {errno.EROFS: "is read-only", errno.EDQUOT: "is over its disk quota"}.get(cause.errno or 0, "is full")


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding `path` (its nearest existing folder's)."""
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def free_text(folder: Path) -> str:
    """"Free there now: F MiB of T MiB. " (empty when the filesystem cannot be asked)."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return ""
    return f"Free there now: {usage.free / 2**20:.0f} MiB of {usage.total / 2**20:.0f} MiB. "
