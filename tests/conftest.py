"""Session fixtures shared by every test folder: the Docker engine and the CPU image built from this tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_IMAGE = "trainkit:latest-cpu"


def _engine_missing(reason: str) -> None:
    """No engine: a failure on CI (env CI set), a skip with the reason elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"Docker engine required on CI: {reason}")
    pytest.skip(f"no Docker engine: {reason}")


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client for the local engine (skips, or fails on CI, without one)."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        _engine_missing(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return client


@pytest.fixture(scope="session")
def cpu_image(docker_client) -> str:
    """`trainkit:latest-cpu`, built once per session from this tree by `scripts/build.py --cpu`
    (a warm rebuild when only the trainer changed takes seconds)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "build.py"), "--cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    if proc.returncode != 0:
        output = f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        pytest.fail(f"`scripts/build.py --cpu` failed (exit {proc.returncode}):\n{output}")
    return CPU_IMAGE
