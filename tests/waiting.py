"""The one `wait_for` of the tests: poll a condition until it holds, or fail naming what never came."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, what: str, *, interval: float = 0.02,
             proc: subprocess.Popen[str] | None = None, log: Path | None = None) -> T:
    """The condition's first true value. Fails after `timeout` s naming `what` (and the tail of `log`), or at once when
    `proc` ends first (with its stderr); `proc` started in its own session is killed, group and all, on a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            stderr = proc.stderr.read()[-3000:] if proc.stderr else ""
            raise AssertionError(f"the process exited ({proc.returncode}) before {what}:\n{stderr}")
        if time.monotonic() > deadline:
            if proc is not None:
                os.killpg(proc.pid, signal.SIGKILL)
            tail = (log.read_text()[-4000:] if log.exists() else "(no log)") if log is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}".rstrip())
        time.sleep(interval)
