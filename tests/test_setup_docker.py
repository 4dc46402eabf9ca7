"""scripts/setup_docker.sh, the host set-up quickstart.sh and tests/run.sh share: where an engine answers it does
nothing; where none does and it cannot install one (no apt-get), it says in one line how to get Docker, exit 1."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def setup_with(tmp_path: Path, tools: list[str], **env: str) -> subprocess.CompletedProcess:
    """Run the script with PATH holding only `tools` (so no apt-get and no dockerd unless listed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        found = shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")  # the system tools, not shims
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    return subprocess.run(["/bin/bash", "scripts/setup_docker.sh"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PATH": str(bin_dir), **env})  # fmt: skip


def test_without_an_engine_or_a_way_to_install_one_it_says_how_to_get_docker(tmp_path: Path) -> None:
    proc = setup_with(tmp_path, ["id", "python3", "docker"], DOCKER_HOST="tcp://127.0.0.1:9")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "No Docker Engine on this machine" in lines[0], proc.stderr
    assert "Docker Desktop" in lines[0] and "apt-get install docker.io" in lines[0]


@pytest.mark.docker
def test_with_an_engine_that_answers_it_changes_nothing(tmp_path: Path, docker_client) -> None:
    proc = setup_with(tmp_path, ["id", "python3", "docker"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
