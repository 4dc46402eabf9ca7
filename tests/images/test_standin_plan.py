"""build.py's stand-in plan: no Docker engine needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = tomllib.loads((ROOT / "images" / "versions.toml").read_text())
NO_ENGINE = {**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:9"}


def build_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "build.py"), *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env=NO_ENGINE)  # fmt: skip


@pytest.mark.parametrize("cuda", list(VERSIONS["standin"]))
def test_standin_plan_names_the_local_base_and_standin_tags(cuda: str) -> None:
    proc = build_py("--cuda", cuda, "--standin", "--arch-list", "9.0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    xy = cuda.replace(".", "")
    standin = VERSIONS["standin"][cuda]
    assert f"CUDA {cuda} (stand-in base)" in proc.stdout
    assert f"base:    trainkit-base:standin-cu{xy}-torch{standin['torch']}-" in proc.stdout
    assert f"tags:    trainkit:0.1.0-cu{xy}-standin, trainkit:latest-cu{xy}-standin" in proc.stdout
    assert "arch:    9.0" in proc.stdout
    assert "nvcr.io" not in proc.stdout and "-ngc" not in proc.stdout
    assert f"stand-in for NGC {VERSIONS['cuda'][cuda]['ngc']}, not NGC" in proc.stdout


def test_standin_base_tag_changes_with_its_inputs(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import matrix
    import standin_base

    entry = matrix.load().entry("12.8")
    text = (ROOT / "images" / "versions.toml").read_text()
    changed = tmp_path / "versions.toml"
    changed.write_text(text.replace('torch = "2.7.1"', 'torch = "2.7.0"'))
    before = standin_base.load_standin(entry)
    after = standin_base.load_standin(entry, changed)
    assert after.torch == "2.7.0"
    assert before.digest("trainkit-rootfs:bookworm") != after.digest("trainkit-rootfs:bookworm")


def test_all_standin_plans_cover_every_row_with_a_standin() -> None:
    proc = build_py("--all", "--standin", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(stand-in base)") == len(VERSIONS["standin"])


@pytest.mark.parametrize("other", [["--ngc", "25.03"], ["--base", "x:y"]])
def test_standin_refuses_another_base(other: list[str]) -> None:
    proc = build_py("--cuda", "12.8", "--standin", *other, "--dry-run")
    assert proc.returncode == 2
    assert "--standin replaces the NGC base" in proc.stderr


def test_a_row_without_standin_inputs_is_a_user_error_naming_the_rows_that_have_them(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import matrix
    import standin_base
    from errors import UserError

    text = (ROOT / "images" / "versions.toml").read_text()
    without = tmp_path / "versions.toml"
    without.write_text(text.replace('[standin."13.0"]', '[not_a_standin."13.0"]'))
    with pytest.raises(UserError) as err:
        standin_base.load_standin(matrix.load().entry("13.0"), without)
    rows = ", ".join(c for c in VERSIONS["standin"] if c != "13.0")
    assert f"CUDA 13.0 has no stand-in base; rows with one: {rows}" in str(err.value)
