"""One run per output folder: `OUTPUT_DIR/.trainkit.lock`, held by the writing process for the run's lifetime.

The lock is a POSIX record lock (`fcntl.lockf`) on that file: the kernel (or the NFS lock manager) releases it when
the holder exits, also by SIGKILL or an OOM kill, so a lock of a dead process never blocks the next run. Record
locks belong to the process, not to its forked children, so a DataLoader worker left behind by a killed trainer
does not hold it, and a torchrun restart of the same run (whose old workers torchrun has ended) takes it at once.
The file names the holder (host, pid, start time); a second run exits 2 naming it.

Filesystems without working locks get a pid file instead (`O_EXCL`): a lock left by a dead process on this host is
taken over with a log line; one from another host must be checked and removed by hand (the message says which file).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

log = logging.getLogger("trainer")

LOCK_NAME = ".trainkit.lock"
NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
BUSY = {errno.EACCES, errno.EAGAIN}


class OutputLock:
    """Held by this process from `acquire()` until `release()` or its exit."""

    def __init__(self, output_dir: str | Path, name: str = LOCK_NAME, busy: Callable[..., str] | None = None) -> None:
        self.path = Path(output_dir) / name
        self._busy = busy or _busy_message  # the message for a second writer: (lock path, holder, pid_file=...)
        self._fd: int | None = None
        self._pid_file = False

    def acquire(self) -> OutputLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in BUSY:
                raise ConfigError(self._busy(self.path, holder)) from None
            if exc.errno in NO_LOCKS:
                return self._acquire_pid_file(exc)
            raise
        self._fd = fd
        previous = _read_holder(fd)
        if previous:
            log.warning("output lock: taking over %s from %s, which ended without releasing it", self.path,
                        _describe(previous))  # fmt: skip
        _write_holder(fd)
        return self

    def _acquire_pid_file(self, why: OSError) -> OutputLock:
        log.warning("output lock: %s does not support file locks (%s); using a pid file instead",
                    self.path.parent, why.strerror)  # fmt: skip
        pid_path = self.path.with_suffix(".pid")
        for _attempt in range(2):
            try:
                fd = os.open(pid_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read_holder_path(pid_path)
                if not _dead_here(holder):
                    raise ConfigError(self._busy(pid_path, holder, pid_file=True)) from None
                log.warning("output lock: taking over %s from %s (that process no longer runs)",
                            pid_path, _describe(holder))  # fmt: skip
                pid_path.unlink(missing_ok=True)
                continue
            self.path, self._fd, self._pid_file = pid_path, fd, True
            _write_holder(fd)
            return self
        raise ConfigError(f"could not take the output folder's lock {pid_path}: another run took it meanwhile")

    def release(self) -> None:
        if self._fd is None:
            return
        if self._pid_file:
            with contextlib.suppress(OSError):
                self.path.unlink()
        with contextlib.suppress(OSError):
            if not self._pid_file:
                os.ftruncate(self._fd, 0)  # a clean end: the next run has no holder to take over from
            os.close(self._fd)  # closing the file releases the record lock
        self._fd = None


_HELD: dict[Path, OutputLock] = {}  # the run's lock, once per process: a second fd's close would release it


def acquire_output_lock(output_dir: str | Path) -> OutputLock:
    """Lock `output_dir` for this run, or exit 2 (ConfigError) naming the run that holds it; a lock this process
    already holds is returned as it is."""
    key = Path(output_dir).absolute()
    if key in _HELD and _HELD[key]._fd is not None:
        return _HELD[key]
    lock = _HELD[key] = OutputLock(output_dir).acquire()
    atexit.register(lock.release)
    log.info("output lock: %s holds %s", _describe(_holder()), lock.path)
    return lock


def lock_beside(target: Path, command: str, named: str | None = None, option: str = "--output") -> OutputLock:
    """One writer at a time of a command's output (`eval --output DIR`, `generate --output FILE`, `export SRC OUT`,
    `reproduce --output DIR`): a lock file beside it, `.NAME.lock`, held until this process ends, then removed; a
    second writer exits 2 naming the first. `named`: how the message names the output (default `COMMAND --output
    TARGET`); `option`: what the user changes to write elsewhere (`--output`, export's `OUT`)."""
    named = named or f"{command} --output {target}"

    def busy(path: Path, holder: dict[str, Any], pid_file: bool = False) -> str:
        return (f"{named}: another {command} is writing it ({_describe(holder)} holds {path}); "
                f"wait for it to finish, or give this one another {option}" + (
                    f" (no file locks here: if that process is gone, delete {path})" if pid_file else ""))  # fmt: skip

    lock = OutputLock(target.parent, f".{target.name}.lock", busy)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock.acquire()

    def release() -> None:
        with contextlib.suppress(OSError):
            lock.path.unlink()
        lock.release()

    atexit.register(release)
    return lock


def _holder() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(),
            "torchelastic_run_id": os.environ.get("TORCHELASTIC_RUN_ID")}  # fmt: skip


def _write_holder(fd: int) -> None:
    data = (json.dumps(_holder()) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def _read_holder_path(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _dead_here(holder: dict[str, Any]) -> bool:
    """True when the holder ran on this host and its process is gone (an unreadable file counts as dead)."""
    if not holder:
        return True
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, ValueError, TypeError):
        return False
    return False


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "an unknown process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"pid {holder.get('pid')} on host {holder.get('host')} (since {since})"


def _busy_message(path: Path, holder: dict[str, Any], pid_file: bool = False) -> str:
    folder = path.parent
    text = (
        f"TRAIN_OUTPUT_DIR={folder} is in use by another run: {_describe(holder)} holds {path}. Two runs in one "
        "folder overwrite each other's checkpoints and metrics: stop the other run, or give this one its own "
        "TRAIN_OUTPUT_DIR"
    )
    if pid_file:
        text += (f". This filesystem has no file locks, so a pid file stands in: if that process is gone (e.g. its "
                 f"host crashed), delete {path}")  # fmt: skip
    return text
