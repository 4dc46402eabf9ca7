"""`python -m trainer doctor` on this machine (the venv's CPU torch), as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")


def doctor(*args: str, env: dict[str, str]):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    return subprocess.run(
        [sys.executable, "-m", "trainer", "doctor", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").write_text("hello world\n" * 50)
    return {"TRAIN_DATA": str(tmp_path / "data"), "TRAIN_OUTPUT_DIR": str(tmp_path / "output")}


def test_json_report_on_a_cpu_machine(paths):
    result = doctor("--json", env=paths)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["problems"] == []
    assert report["gpus"] == [] and report["capability"] is None and report["nccl"] is None
    assert report["torch"]["build"] == "cpu" and isinstance(report["torch"]["cxx11_abi"], bool)
    assert report["versions"]["torch"].startswith(report["torch"]["version"].split("+")[0])
    assert report["bitsandbytes"]["backend"] in (None, "CPU")
    assert set(report["deepspeed"]["ops"].values()) <= {"installed", "jit", "unavailable"}
    assert report["shm_bytes"] > 0
    assert report["user"]["uid"] == os.getuid()
    assert report["data"] == {"path": paths["TRAIN_DATA"], "readable": True}
    assert report["output"]["writable"] is True
    assert not Path(paths["TRAIN_OUTPUT_DIR"]).exists(), "doctor leaves no trace"
    assert all(check["status"] in ("ok", "info", "warn", "fail") for check in report["checks"])


def test_problems_make_it_fail_with_one_reason_each(paths, tmp_path):
    env = {**paths, "TRAIN_DATA": str(tmp_path / "missing.jsonl"), "TRAIN_ATTN": "flash_attention_2"}
    result = doctor("--json", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert report["data"]["readable"] is False and report["config"]["ok"] is False
    assert any(p.startswith("Data:") and "missing.jsonl" in p for p in report["problems"])
    assert any("flash_attn" in p for p in report["problems"])

    table = doctor(env=env)
    assert table.returncode == 2
    assert "trainkit doctor" in table.stdout and "cannot work here" in table.stdout
    assert "Traceback" not in table.stderr


def test_unknown_option(paths):
    result = doctor("--yaml", env=paths)
    assert result.returncode == 2
    assert "--yaml" in result.stderr
