"""DeepSpeed ZeRO-2 with CPU offload, trained for real in the CPU image (its cpu_adam is prebuilt there)."""

from __future__ import annotations

import json
import math
import os

import pytest

pytestmark = pytest.mark.docker


def test_zero2_cpu_offload_trains_with_prebuilt_ops(docker_client, cpu_image, tmp_path):
    output = tmp_path / "output"
    extensions = tmp_path / "torch_extensions"  # where DeepSpeed would JIT-compile a missing op
    output.mkdir()
    extensions.mkdir()
    env = {
        "TRAIN_ZERO_STAGE": "2",
        "TRAIN_ZERO_OFFLOAD": "cpu",
        "TRAIN_PRECISION": "bf16",
        "TRAIN_SEQ_LEN": "64",
        "TRAIN_BATCH_SIZE": "4",
        "TRAIN_MAX_STEPS": "3",
        "TRAIN_LOG_STEPS": "1",
        "TRAIN_SAVE_STEPS": "3",
    }
    container = docker_client.containers.run(
        cpu_image,
        ["train"],
        environment=env,
        user=f"{os.getuid()}:{os.getgid()}",
        volumes={
            str(output): {"bind": "/output", "mode": "rw"},
            str(extensions): {"bind": "/cache/torch_extensions", "mode": "rw"},
        },
        detach=True,
    )
    try:
        status = container.wait(timeout=600)
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 0, logs[-4000:]
    jit_built = sorted(p.name for p in extensions.rglob("*.so"))
    assert not jit_built, f"DeepSpeed JIT-compiled {jit_built} instead of loading its prebuilt ops"

    config = json.loads((output / "run_config.json").read_text())
    zero = config["deepspeed"]["zero_optimization"]
    assert zero["stage"] == 2 and zero["offload_optimizer"]["device"] == "cpu"
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert (output / "checkpoint-3").is_dir() and (output / "final").is_dir()
