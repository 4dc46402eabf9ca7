"""The build's check of a real base against its row (scripts/base_check.py): a base whose torch string, CUDA, Python,
apex or constraint file differ from images/versions.toml fails the build naming each difference, before anything is
built on it. NGC cannot be pulled here: the docker test reads a real local base (the CPU flavor's) under an NGC tag."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import base_check  # noqa: E402
import matrix  # noqa: E402
from errors import UserError  # noqa: E402

MATRIX = matrix.load()


def as_the_row_says(entry: matrix.Entry) -> base_check.BaseFacts:
    return base_check.BaseFacts(entry.torch, entry.cuda, entry.python, entry.includes["apex"],
                                base_check.constraint_expected(entry))  # fmt: skip


@pytest.mark.parametrize("row", [*MATRIX.entries, "rl"])
def test_a_base_that_is_what_its_row_says_passes(row: str) -> None:
    entry = MATRIX.rl if row == "rl" else MATRIX.entry(row)
    assert base_check.differences(entry, as_the_row_says(entry)) == []
    assert base_check.check(entry, entry.base_image, as_the_row_says(entry)).startswith("the base matches")


def test_every_difference_is_named_with_both_sides() -> None:
    """26.07 from a weaker source: a longer hash in the real torch string, another CUDA and Python, no apex, no
    constraint file: the first real build fails naming all five."""
    entry = MATRIX.entry("13.3")
    real = base_check.BaseFacts("2.13.0a0+9186a08e51.nv26.07", "13.2", "3.13", False, False)
    found = base_check.differences(entry, real)
    assert len(found) == 5
    assert found[0] == 'torch: the base reports "2.13.0a0+9186a08e51.nv26.07", the row says torch = ' \
                       f'"{entry.torch}"'  # fmt: skip
    with pytest.raises(UserError) as err:
        base_check.check(entry, entry.base_image, real)
    message = str(err.value)
    assert "nvcr.io/nvidia/pytorch:26.07-py3 is not what images/versions.toml says of the CUDA 13.3 row" in message
    for what in ("CUDA: the base's torch was built with CUDA 13.2", "Python: the base runs 3.13",
                 "apex: the base has no apex", "constraint file: the base has no /etc/pip/constraint.txt"):
        assert what in message, what
    assert "Correct the row" in message


def test_the_constraint_file_is_expected_from_ngc_25_03_on() -> None:
    assert not base_check.constraint_expected(MATRIX.entry("12.6"))  # 24.12
    assert base_check.constraint_expected(MATRIX.entry("12.8"))  # 25.03
    assert base_check.constraint_expected(MATRIX.rl)


def plan(**fields: object) -> argparse.Namespace:
    return argparse.Namespace(**{"flavor": "cuda", "cuda": "13.3", "standin": False, "rl": False, **fields})


def args(**fields: object) -> argparse.Namespace:
    return argparse.Namespace(**{"base": None, "ngc": None, **fields})


def test_which_row_a_build_is_checked_against() -> None:
    assert base_check.checked_entry(MATRIX, plan(), args()) is MATRIX.entry("13.3")
    assert base_check.checked_entry(MATRIX, plan(rl=True, cuda="13.4"), args()) is MATRIX.rl
    assert base_check.checked_entry(MATRIX, plan(), args(ngc="25.12")) is MATRIX.entry("13.1")
    assert base_check.checked_entry(MATRIX, plan(), args(ngc="25.01")) is None  # not a row: nothing to compare
    assert base_check.checked_entry(MATRIX, plan(standin=True), args()) is None
    assert base_check.checked_entry(MATRIX, plan(), args(base="x:y")) is None
    assert base_check.checked_entry(MATRIX, plan(flavor="cpu", cuda=None), args()) is None


@pytest.mark.docker
def test_a_real_base_that_differs_fails_the_build_before_anything_is_built(docker_client, cpu_image: str) -> None:
    """The CPU flavor's base (a real image: torch 2.13.0+cpu, Python 3.11, NGC-style constraint file) tagged as NGC
    26.07: `build.py --cuda 13.3` reads it, exits 1 naming each difference, and builds nothing."""
    cpu_base = docker_client.images.get(MATRIX.cpu.base_image)
    ngc = MATRIX.entry("13.3").base_image
    assert not docker_client.images.list(name=ngc), f"{ngc} is here for real: this test would untag it"
    cpu_base.tag(ngc)
    try:
        facts = base_check.read_base(docker_client, ngc)
        assert (facts.torch, facts.cuda, facts.python) == (f"{MATRIX.cpu.torch}+cpu", None, MATRIX.cpu.python)
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "build.py"), "--cuda", "13.3", "--arch", "9.0"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ))  # fmt: skip
    finally:
        docker_client.images.remove(ngc, noprune=True)
    assert proc.returncode == 1, proc.stderr
    assert "is not what images/versions.toml says of the CUDA 13.3 row (NGC 26.07)" in proc.stderr
    assert f'torch: the base reports "{MATRIX.cpu.torch}+cpu"' in proc.stderr
    assert "CUDA: the base's torch was built with CUDA none (a CPU build)" in proc.stderr
    assert "building trainkit" not in proc.stderr and "Traceback" not in proc.stderr
