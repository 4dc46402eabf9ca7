"""The server as a child process: the port checked free before it starts, readiness awaited on GET /v1/models, and
its whole process group ended on the way out (vLLM's engine and worker processes too), so nothing outlives `serve`.

The child runs in a session of its own: a terminal's Ctrl-C reaches `serve`, which stops the server in order
(SIGTERM to the group, SIGKILL after STOP_GRACE_S). The kernel kills it should `serve` itself die
(trainer.lifetime.die_with_parent).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from trainer.errors import ConfigError
from trainer.lifetime import die_with_parent

STOP_GRACE_S = 30.0
POLL_S = 0.25


class ServerFailed(Exception):
    """The server exited, or was not ready in time: exit 1 with its reason."""


def check_port(host: str, port: int) -> None:
    """ConfigError (exit 2) when something already listens on host:port, naming the fix."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            raise ConfigError(f"serve --host {host} --port {port}: the port {why}; stop what listens there or give "
                              "another --port") from None  # fmt: skip


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    """The server, its output on this process's stdout/stderr."""
    return subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return isinstance(json.loads(response.read()).get("data"), list)
    except (OSError, ValueError, urllib.error.URLError):
        return False


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float) -> float:
    """Seconds until GET url/models lists models; ServerFailed when the server exits first or `timeout` passes."""
    start_time = time.monotonic()
    while not _answers(f"{url}/models"):
        if proc.poll() is not None:
            raise ServerFailed(f"the server exited with code {proc.returncode} before it was ready (its output is "
                               "above)")  # fmt: skip
        if time.monotonic() - start_time > timeout:
            raise ServerFailed(f"the server was not ready within {timeout:g} s (--ready-timeout); stopped it")
        time.sleep(POLL_S)
    return time.monotonic() - start_time


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after STOP_GRACE_S; returns when none is left."""
    pgid = proc.pid  # the session leader's pid is its group's id
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and (proc.poll() is None or _group_alive(pgid)):
        time.sleep(POLL_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + STOP_GRACE_S
    while _group_alive(pgid) and time.monotonic() < deadline:  # members SIGKILLed above, not yet reaped
        time.sleep(POLL_S)
