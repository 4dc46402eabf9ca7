"""The user's code in the run (reward functions, tools, environments): its file imported, its calls bounded.

`import_file` imports a user's Python file once per process, an error in it a ConfigError (exit 2) naming the file
and the setting. `time_limit` interrupts the call in its block with `TimeUp` once its seconds have passed, and
`grace` seconds after a SIGTERM/SIGINT (or at once when less of the grace is left). TimeUp is a BaseException: the
user's `except Exception` does not eat it. The stop is passed on to the handler before (trainer.run.signals'
GracefulStop, which logs it and stops the run at the end of the step). What a caller does with an interrupted call
is its own rule: a reward stops the run without finishing the step (trainer.run.rewards), a tool call ends as an
error the model reads (trainer.run.tool_calls). Signals reach the main thread only: elsewhere the call runs
unbounded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, ModuleType

from trainer.errors import ConfigError

STOP_GRACE_S = 30.0  # how long a call may go on after SIGTERM/SIGINT before the run stops without it


def import_file(path: str, setting: str) -> ModuleType:
    """The user's Python file at `path`, imported once per process; ConfigError naming `setting` when it fails."""
    resolved = Path(path).resolve()
    name = f"trainkit_user_{abs(hash(str(resolved)))}"
    module = sys.modules.get(name)
    if module is not None:
        return module
    loader = importlib.util.spec_from_file_location(name, resolved)
    if loader is None or loader.loader is None:
        raise ConfigError(f"{setting}: {resolved} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except Exception as exc:  # the user's module: its import error, named
        raise ConfigError(f"{setting}: importing {resolved} failed: {type(exc).__name__}: {exc}") from None
    sys.modules[name] = module
    return module


class TimeUp(BaseException):
    """Raised inside a bounded call by the alarm."""


@contextlib.contextmanager
def time_limit(seconds: float, grace: float = STOP_GRACE_S) -> Iterator[list[int]]:
    """Interrupt the block after `seconds` (0: never) and `grace` seconds after a stop, with TimeUp; yields a list
    that holds the stop signal's number when a stop came before or during the block."""
    from trainer.run.signals import requested_signal

    stopped: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield stopped
        return
    grace = max(grace, 0.001)  # an itimer of 0 is no alarm at all
    if requested_signal() is not None:  # the stop came before this call: it gets what is left of the grace
        stopped.append(requested_signal() or 0)
        seconds = min(seconds or grace, grace)

    def alarm(_signum: int, _frame: FrameType | None) -> None:
        raise TimeUp

    def stop(signum: int, frame: FrameType | None) -> None:
        previous = before.get(signal.Signals(signum))
        if callable(previous):
            previous(signum, frame)
        stopped.append(signum)
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        if not left or left > grace:
            signal.setitimer(signal.ITIMER_REAL, grace)

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    old_alarm = signal.signal(signal.SIGALRM, alarm)
    if seconds:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield stopped
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_alarm)
        for sig, handler in before.items():
            signal.signal(sig, handler)
