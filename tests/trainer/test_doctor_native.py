"""doctor outside the image (`pip install -e '.[train]'`, run natively): PyPI's Linux torch is a CUDA build, so on a
CPU machine torch reports a CUDA version and no GPU. That is a CPU run, not a failure; only a trainkit CUDA image (its
build manifest says so) without a visible GPU is one. PyPI's CUDA torch cannot be installed here (gigabytes of
NVIDIA wheels), so a sitecustomize gives the host's CPU torch the CUDA version such a build reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def doctor(tmp_path: Path, **extra_env: str) -> tuple[int, dict, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("import torch.version\ntorch.version.cuda = '12.8'\n")
    env = {key: value for key, value in os.environ.items() if key != "TRAINKIT_MANIFEST"}
    env = {**env, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "TRAIN_OUTPUT_DIR": str(tmp_path / "out"),
           "CUDA_VISIBLE_DEVICES": "", **extra_env}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "trainer", "doctor", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.stdout, proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def gpus_check(report: dict) -> dict:
    return next(check for check in report["checks"] if check["key"] == "gpus")


def test_native_cuda_torch_without_a_gpu_runs_on_the_cpu(tmp_path: Path) -> None:
    code, report, stderr = doctor(tmp_path)
    check = gpus_check(report)
    assert "CUDA 12.8 build" in check["shown"], check  # the stand-in for PyPI's CUDA torch took effect
    assert check["status"] == "info" and "the run will use the CPU" in check["shown"]
    assert not any("CUDA image" in problem for problem in report["problems"]), report["problems"]
    assert code == (2 if report["problems"] else 0), stderr[-2000:]


def test_a_cuda_image_without_a_gpu_still_fails(tmp_path: Path) -> None:
    manifest = tmp_path / "build-manifest.json"
    manifest.write_text(json.dumps({"base": {"version": "2.7.0", "cuda": "12.8"}, "extensions": {}}))
    code, report, _ = doctor(tmp_path, TRAINKIT_MANIFEST=str(manifest))
    assert code == 2
    assert gpus_check(report)["status"] == "fail"
    assert any("this is a CUDA image but no GPU is visible" in problem for problem in report["problems"])
