"""Every benchmark runs as docs/benchmarks.md says, `python -m benchmarks.NAME` from the repository root, here in
its smallest form (issue 34 item 6: trainer_overhead died with ModuleNotFoundError: 'data_prep' after its training
part). gpu_run's own test is test_gpu_run.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SMALLEST = [
    pytest.param("data_prep", ["--small-mb", "0.1", "--factor", "2", "--workers", "0"], id="data_prep"),
    pytest.param("data_prep", ["--corpus", "mix", "--small-mb", "0.1", "--factor", "2"], id="data_prep --corpus mix"),
    pytest.param("startup", ["--build", "--presets", "tiny", "--repeat", "1"], id="startup --build"),
    pytest.param("trainer_overhead", ["--repeats", "1", "--steps", "6", "--nprocs", "1", "--data-mb", "0.1"],
                 marks=pytest.mark.slow, id="trainer_overhead"),
    pytest.param("contention", ["--steps", "5", "--variants", "threads1", "--contended", "yes"], marks=pytest.mark.slow,
                 id="contention"),
    pytest.param("build_times", ["--warm-only"], marks=[pytest.mark.docker, pytest.mark.slow], id="build_times"),
]
OWN_TESTS = {"__init__", "gpu_run", "gpu_support"}  # gpu_run and the helpers it imports: tests/bench/test_gpu_run.py


def test_every_benchmark_has_its_smallest_form_here() -> None:
    names = {p.stem for p in (REPO / "benchmarks").glob("*.py")} - OWN_TESTS
    assert names == {p.values[0] for p in SMALLEST}, "add the new benchmark's smallest form to SMALLEST"


@pytest.mark.parametrize(("name", "args"), SMALLEST)
def test_the_benchmark_runs_in_its_smallest_form(name: str, args: list[str], request: pytest.FixtureRequest) -> None:
    if name == "build_times":  # a warm rebuild of the session's image, never a second build beside it
        request.getfixturevalue("cpu_image")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip()
