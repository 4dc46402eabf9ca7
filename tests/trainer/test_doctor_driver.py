"""doctor's driver verdict: this image's CUDA floor against the host driver (a stub nvidia-smi stands in for the
driver, as a GPU machine's would answer), forward compatibility on datacenter GPUs, or the row to use instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.doctor.driver import parse_floors, verdict

REPO = Path(__file__).resolve().parents[2]
FLOORS = "12.1=530,12.4=550.54.15,12.6=560.35.05,12.8=570.124.06,12.9=575.57.08,13.0=580.95.05"


@pytest.mark.parametrize(
    ("driver", "gpu", "compat", "status", "says"),
    [
        ("570.124.06", "NVIDIA H100 80GB HBM3", False, "ok", "meets this image's floor"),
        ("580.95.05", "NVIDIA GeForce RTX 4090", False, "ok", "meets this image's floor"),
        ("550.54.15", "NVIDIA H100 80GB HBM3", True, "warn", "forward compatibility applies"),
        ("535.104.05", "Tesla T4", True, "warn", "forward compatibility applies"),
        ("550.54.15", "NVIDIA A10G", True, "warn", "forward compatibility applies"),
        ("550.54.15", "NVIDIA GeForce RTX 4090", True, "fail", "needs a datacenter GPU"),
        ("550.54.15", "NVIDIA RTX A4000", True, "fail", "needs a datacenter GPU"),
        ("550.54.15", "NVIDIA H100 80GB HBM3", False, "fail", "no forward-compatibility libraries"),
    ],
)
def test_verdict(driver: str, gpu: str, compat: bool, status: str, says: str) -> None:
    got, shown, fix = verdict(driver, gpu, "570.124.06", parse_floors(FLOORS), compat)
    assert (got, says in shown) == (status, True), shown
    if status != "ok":
        assert "CUDA 12.4 image (trainkit:latest-cu124)" in fix or "CUDA 12.1" in fix


def test_a_driver_older_than_every_row_names_no_row() -> None:
    status, _, fix = verdict("470.82.01", "NVIDIA GeForce RTX 3090", "570.124.06", parse_floors(FLOORS), False)
    assert status == "fail" and "no row of the matrix runs on it" in fix


def test_cpu_image_and_no_driver_are_information_only() -> None:
    assert verdict("550.54.15", None, "", {}, False)[0] == "info"
    assert verdict(None, None, "570.124.06", parse_floors(FLOORS), False)[0] == "info"


def doctor(tmp_path: Path, driver: str, gpu: str) -> tuple[int, dict]:
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "nvidia-smi").write_text(
        f'#!/bin/sh\ncase "$*" in *driver_version*) echo {driver};; *name*) echo "{gpu}";; esac\n'
    )
    (stub / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "TRAINKIT_DRIVER_MIN": "570.124.06", "TRAINKIT_DRIVER_FLOORS": FLOORS,
           "TRAIN_OUTPUT_DIR": str(tmp_path / "out")}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "trainer", "doctor", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


def test_doctor_says_which_row_to_use_for_an_old_driver(tmp_path: Path) -> None:
    code, report = doctor(tmp_path, "550.54.15", "NVIDIA GeForce RTX 4090")
    assert code == 2
    assert report["driver_floor"] == {"floor": "570.124.06", "verdict": "fail"}
    assert any("use the CUDA 12.4 image (trainkit:latest-cu124)" in p for p in report["problems"])


def test_doctor_passes_a_driver_that_meets_the_floor(tmp_path: Path) -> None:
    _, report = doctor(tmp_path, "575.57.08", "NVIDIA H100 80GB HBM3")
    assert report["driver_floor"]["verdict"] == "ok"
    assert not any(p.startswith("Driver vs image") for p in report["problems"])
