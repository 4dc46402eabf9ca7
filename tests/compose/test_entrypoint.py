"""The image's entrypoint: PID 1, signals, dispatch, and an environment any UID can work in."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

ENTRYPOINT = Path(__file__).resolve().parents[2] / "entrypoints" / "entrypoint.sh"


def docker_run(image: str, *args: str, user: str = "4321:4321", timeout: float = 120):
    return subprocess.run(
        ["docker", "run", "--rm", "--user", user, image, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_any_command_runs_with_a_writable_home_for_an_unknown_uid(cpu_image):
    script = (
        "import getpass, os, pathlib; home = pathlib.Path(os.environ['HOME']); (home / 'probe').write_text('x'); "
        "print('user', getpass.getuser(), 'home-ok', 'cache-ok', os.access('/cache/huggingface', os.W_OK))"
    )
    result = docker_run(cpu_image, "python", "-c", script)
    assert result.returncode == 0, result.stderr
    assert "home-ok cache-ok True" in result.stdout
    assert "running python" in result.stderr  # the entrypoint logs the program, never its arguments
    assert script not in result.stderr


def test_pid_1_is_dumb_init_and_shell_dispatch(cpu_image):
    result = docker_run(cpu_image, "shell", "-c", "echo $(cat /proc/1/comm) $(id -u)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["dumb-init", "4321"]
    assert "running bash" in result.stderr


def test_sigterm_reaches_the_command(cpu_image):
    """`docker stop` -> dumb-init -> the exec'd command's own handler (here: exit 42), long before the timeout."""
    handler = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    name = f"trainkit-sigterm-{time.monotonic_ns()}"
    subprocess.run(["docker", "run", "-d", "--name", name, cpu_image, "python", "-c", handler], check=True,
                   capture_output=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "ready" not in subprocess.run(["docker", "logs", name], capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.2)
        started = time.monotonic()
        subprocess.run(["docker", "stop", "-t", "30", name], check=True, capture_output=True)
        assert time.monotonic() - started < 10
        code = subprocess.run(["docker", "inspect", "-f", "{{.State.ExitCode}}", name], capture_output=True, text=True)
        assert code.stdout.strip() == "42"
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def test_unknown_trainer_argument_goes_to_train(cpu_image):
    """A leading option is an argument for `train`; the trainer refuses it as a user mistake (exit 2)."""
    result = docker_run(cpu_image, "--bogus")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "running python -m trainer.launch train" in result.stderr


def test_entrypoint_outside_docker_gives_a_home(tmp_path):
    """The same script on the host: HOME unwritable -> a private one under /tmp."""
    script = "import os; print(os.environ['HOME'], os.access(os.environ['HOME'], os.W_OK))"
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "python3", "-c", script],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[1] == "True"
    assert result.stdout.startswith("/tmp/home-")
