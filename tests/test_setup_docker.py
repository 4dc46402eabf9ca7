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


def test_the_test_command_refuses_a_disk_too_small_for_it_before_installing_anything(tmp_path: Path) -> None:
    """tests/run.sh on a disk with less free than a run needs exits 1 at once, naming the space free, the space
    needed and how to make room: a disk that fills halfway fails tests with errors that do not name it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the test suite runs as root in CI)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        (disk / "tests").mkdir()
        shutil.copy(ROOT / "tests" / "run.sh", disk / "tests" / "run.sh")
        proc = subprocess.run(["/bin/bash", str(disk / "tests" / "run.sh")], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        left = sorted(p.name for p in disk.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == "" and left == ["tests"]  # nothing set up, nothing written
    assert f"tests/run.sh: 0 GB free on {disk}; a run from this checkout needs about 26 GB" in proc.stderr
    assert "docker system prune -a, ~/.cache/pip" in proc.stderr
