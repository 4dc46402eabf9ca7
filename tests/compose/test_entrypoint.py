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


# -- issue 12 defect 8: chain through NGC's /opt/nvidia/nvidia_entrypoint.sh where the base has it -----------

# What NGC's entrypoint does that matters here: banner on stdout, its entrypoint.d parts export the forward
# compatibility set-up, then `exec "$@"`.
NGC_STANDIN = """#!/bin/bash
echo "== NGC stand-in banner =="
export NGC_FORWARD_COMPAT=done
exec "$@"
"""
PROBE = "import os; print('cmd', os.environ.get('NGC_FORWARD_COMPAT'), os.getpid())"


def standin(tmp_path, mode=0o755):
    script = tmp_path / "nvidia_entrypoint.sh"
    script.write_text(NGC_STANDIN)
    script.chmod(mode)
    return script


def run_entrypoint(ngc_path, *command):
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TRAINKIT_NGC_ENTRYPOINT": str(ngc_path)}
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), *command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    out, err = proc.communicate(timeout=60)
    return proc, out, err


def test_the_command_runs_through_ngcs_entrypoint(tmp_path):
    proc, out, err = run_entrypoint(standin(tmp_path), "python3", "-c", PROBE)
    assert proc.returncode == 0, err
    assert out.split() == ["cmd", "done", str(proc.pid)]  # stdout is the command's alone; every step exec'd
    assert "NGC stand-in banner" in err


def test_a_missing_or_non_executable_ngc_entrypoint_is_fine(tmp_path):
    proc, out, err = run_entrypoint(tmp_path / "absent.sh", "python3", "-c", PROBE)
    assert proc.returncode == 0, err
    assert out.split() == ["cmd", "None", str(proc.pid)]
    proc, out, err = run_entrypoint(standin(tmp_path, mode=0o644), "python3", "-c", PROBE)
    assert proc.returncode == 0, err
    assert out.split()[:2] == ["cmd", "None"] and "banner" not in err


def test_sigterm_reaches_the_command_through_ngcs_entrypoint(tmp_path):
    handler = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(42))\n"
               "print('ready', flush=True)\ntime.sleep(60)\n")  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TRAINKIT_NGC_ENTRYPOINT": str(standin(tmp_path))}
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), "python3", "-c", handler], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.terminate()
        assert proc.wait(timeout=10) == 42
    finally:
        proc.kill()


def test_in_the_image_ngcs_entrypoint_is_chained_under_dumb_init(cpu_image, tmp_path):
    """The default path, in a real container: a stand-in mounted where NGC keeps its entrypoint."""
    script = standin(tmp_path)
    probe = "import os; print(open('/proc/1/comm').read().strip(), os.environ.get('NGC_FORWARD_COMPAT'))"
    result = subprocess.run(
        ["docker", "run", "--rm", "--user", "4321:4321", "-v", f"{script}:/opt/nvidia/nvidia_entrypoint.sh:ro",
         cpu_image, "python", "-c", probe],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["dumb-init", "done"]
    assert "NGC stand-in banner" in result.stderr
