"""`bench` inside the CPU image: the entrypoint's command, the mounted output folder, the trainer's skips."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker


def test_bench_command_in_the_cpu_image(docker_client, cpu_image: str, tmp_path: Path) -> None:
    output = tmp_path / "output"
    output.mkdir()
    container = docker_client.containers.run(
        cpu_image,
        command=["bench", "--rows", "fp32,fp16", "--steps", "2", "--warmup", "1", "--json"],
        environment={"TRAIN_MODEL": "tiny", "TRAIN_SEQ_LEN": "64", "TRAIN_BATCH_SIZE": "4"},
        volumes={str(output): {"bind": "/output", "mode": "rw"}},
        user=f"{os.getuid()}:{os.getgid()}",
        detach=True,
    )
    try:
        status = container.wait(timeout=600)
        logs = container.logs(stdout=True, stderr=True).decode(errors="replace")
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 0, logs[-4000:]
    result = json.loads(stdout[stdout.index("{"):])
    rows = {r["name"]: r for r in result["rows"]}
    assert rows["fp32"]["status"] == "ok" and rows["fp32"]["tokens_per_s"] > 0
    assert rows["fp16"]["status"] == "skipped" and "fp16" in rows["fp16"]["reason"]
    # every row is measured on top of the trainer's defaults; fp32 is the baseline, never a recommendation
    assert rows["auto"]["status"] == "ok" and result["recommended"]["row"] == "auto"
    for name in ("results.md", "results.json", "results.csv", "chart.png", "recommended.env"):
        assert (output / "bench" / name).is_file(), name
