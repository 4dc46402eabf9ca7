"""benchmarks/gpu_run.py's --dry-run: the GPU run's own driver on the CPU with the tiny preset and tiny shapes
(issue 34 item 8): each part appends its JSON lines as it ends, and the table comes last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_run import PARTS

REPO = Path(__file__).resolve().parents[2]


def dry_run(tmp_path: Path, parts: str, timeout: int) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "gpu_run.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_run", "--dry-run", "--only", parts, "--out", str(out),
         "--work", str(tmp_path / "work")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return proc, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_the_whole_dry_run(tmp_path: Path) -> None:
    """Every part, once, as the GPU machine runs them (one run: each part's trainer rows cost a process start)."""
    proc, records = dry_run(tmp_path, ",".join(PARTS), 1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    by_part = {part: [r for r in records if r["part"] == part] for part in PARTS}
    assert [r["name"] for r in by_part["gemm"]] == ["bf16 matmul 256^3", "copy 64 MiB"]
    assert by_part["gemm"][0]["tflops"] > 0 and by_part["gemm"][1]["gb_per_s"] > 0
    assert [r["name"] for r in by_part["sdpa"]] == ["causal, no mask", "dense boolean mask"]
    (auto,) = by_part["auto"]
    assert auto["status"] == "ok" and auto["tokens_per_s"] > 0 and auto["measured_steps"] == 3, auto
    assert auto["batch_size"] == 8 and auto["to_first_step_s"] > 0 and "TRAIN_BATCH_SIZE" not in auto["env"]
    assert set(auto["phases_s"]) >= {"imports_and_config", "model", "first_step"}
    status = {(r["part"], r["name"]): r.get("status", "ok") for r in records}
    whole = by_part["whole"][0]
    assert whole["status"] == "ok" and whole["compile"] is True and whole["compile_s"] > 0, whole
    assert status[("chat", "chat records")] == status[("chat", "chat stream")] == "ok", records
    assert status[("techniques", "fp32")] == status[("techniques", "lora")] == "ok", records
    assert status[("warm", "auto warm")] == status[("eager", "eager")] == "ok"
    assert ("gputests", "tests/gpu") in status
    table = proc.stdout[proc.stdout.index("| part | name |"):]
    assert table.count("\n| ") == len(records)  # one row per line of --out, printed last
