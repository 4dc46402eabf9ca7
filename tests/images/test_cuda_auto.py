"""`--cuda auto`: the row follows the host driver (a stub nvidia-smi on PATH stands in for the driver)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def stub_nvidia_smi(folder: Path, driver: str, gpu: str = "NVIDIA H100 80GB HBM3", count: int = 8) -> Path:
    """An nvidia-smi that answers the query the way the real one does (csv, noheader)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    lines = "\n".join(f"{driver}, {gpu}" for _ in range(count))
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{lines}\nEOF\n")
    script.chmod(0o755)
    return folder


def build_dry_run(path_prefix: Path | None, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    else:
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                      if not Path(p, "nvidia-smi").exists())  # fmt: skip
    return subprocess.run([sys.executable, "scripts/build.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(("driver", "cuda"), [("550.54.15", "12.4"), ("570.124.06", "12.8"), ("560.35.05", "12.6"),
                                              ("535.104.05", "12.1"), ("575.57.08", "12.9"),
                                              ("580.65.06", "13.0"), ("610.43.02", "13.0")])  # fmt: skip
def test_auto_plans_the_newest_row_the_driver_meets(tmp_path, driver, cuda):
    proc = build_dry_run(stub_nvidia_smi(tmp_path / "bin", driver), "--cuda", "auto", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"plan: trainkit 0.1.0, CUDA {cuda}"
    why = next(line for line in lines if "--cuda auto:" in line)
    assert f"driver {driver} meets CUDA {cuda}'s floor" in why
    assert "nvidia-smi" in why and "NVIDIA H100 80GB HBM3" in why


def test_auto_prefers_a_verified_row_and_names_the_newer_unverified_ones(tmp_path):
    """R580 meets every 13.x floor; 13.1-13.3's facts are unverified, so auto plans 13.0 and says why."""
    proc = build_dry_run(stub_nvidia_smi(tmp_path / "bin", "580.65.06"), "--cuda", "auto", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "CUDA 13.1, 13.2, 13.3 also fit(s) the driver, but the row's facts are unverified" in proc.stdout


def test_auto_names_the_next_row_and_its_floor(tmp_path):
    proc = build_dry_run(stub_nvidia_smi(tmp_path / "bin", "550.54.15"), "--cuda", "auto", "--dry-run")
    assert "CUDA 12.6 needs >= 560.35.05" in proc.stdout


def test_auto_names_r580_as_the_floor_of_the_13_x_rows(tmp_path):
    """Every 13.x row needs R580 (CUDA 13's first driver, 580.65.06): an R575 host gets 12.9 and is told so."""
    proc = build_dry_run(stub_nvidia_smi(tmp_path / "bin", "575.57.08"), "--cuda", "auto", "--dry-run")
    assert "CUDA 13.0 needs >= 580.65.06" in proc.stdout


def test_auto_never_picks_the_online_rl_row(tmp_path):
    proc = build_dry_run(stub_nvidia_smi(tmp_path / "bin", "700.10.01"), "--cuda", "auto", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "nvidia/vllm" not in proc.stdout and "plan: trainkit 0.1.0, CUDA 13.0" in proc.stdout


def test_auto_with_a_driver_older_than_every_floor_exits_2(tmp_path):
    proc = build_dry_run(stub_nvidia_smi(tmp_path / "bin", "470.82.01"), "--cuda", "auto", "--dry-run")
    assert proc.returncode == 2
    assert "driver 470.82.01 is older than every row's floor" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_auto_without_any_driver_exits_2_listing_the_rows():
    proc = build_dry_run(None, "--cuda", "auto", "--dry-run")
    assert proc.returncode == 2
    assert "found no NVIDIA driver" in proc.stderr and "12.8 (driver >= 570.124.06)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_failing_nvidia_smi_counts_as_no_driver(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    (folder / "nvidia-smi").chmod(0o755)
    proc = build_dry_run(folder, "--cuda", "auto", "--dry-run")
    assert proc.returncode == 2 and "found no NVIDIA driver" in proc.stderr


@pytest.mark.parametrize(("driver", "status", "says"), [
    ("580.65.06", "ok", "meets this image's floor (>= 580.65.06)"),
    ("575.57.08", "fail", "use the CUDA 12.9 image (trainkit:latest-cu129)"),
])  # fmt: skip
def test_doctor_in_a_13_x_image_follows_the_r580_floor(driver: str, status: str, says: str) -> None:
    """doctor inside the 13.3 image, with the floors build.py writes into it (TRAINKIT_DRIVER_MIN/_FLOORS)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import matrix

    from trainer.doctor.driver import verdict

    rows = matrix.load().entries
    floors = {cuda: entry.driver_min for cuda, entry in rows.items()}
    got, shown, fix = verdict(driver, "NVIDIA GeForce RTX 4090", rows["13.3"].driver_min, floors, False)
    assert got == status and says in shown + fix, (shown, fix)
