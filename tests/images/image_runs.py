"""Runs shared by the image tests: the tiny preset trained inside an image, as a user would run it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

TINY_TWO_STEPS = {"TRAIN_MODEL": "tiny", "TRAIN_MAX_STEPS": "2", "TRAIN_SEQ_LEN": "64", "TRAIN_LOG_STEPS": "1"}


def train_tiny_in(image: str, out_dir: Path, *command: str) -> list[int]:
    """`docker run` the image's `command` (its default when empty) on TINY_TWO_STEPS with `out_dir` as /output;
    asserts it exits 0 and leaves final/, and returns the steps in metrics.jsonl."""
    out_dir.mkdir(mode=0o777)
    out_dir.chmod(0o777)  # the container's default user writes there
    proc = subprocess.run(
        ["docker", "run", "--rm", *(f"-e{k}={v}" for k, v in TINY_TWO_STEPS.items()), "-v", f"{out_dir}:/output",
         image, *command],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out_dir / "final").is_dir()
    return [json.loads(line)["step"] for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
