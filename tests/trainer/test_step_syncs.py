"""trainkit adds no host read of a tensor and no device collective to a training step outside logging steps.

A real run of each side, one process and two (torchrun over gloo), counted by tests/trainer/step_syncs.py (its
docstring says what a step's window holds and what is counted). A plain Transformers `Trainer` script is the
reference: its own loop reads the loss (the NaN/Inf filter) and, with several ranks, gathers the token count
every step (transformers 5); trainkit must count the same per step, or fewer reads (it turns the NaN/Inf
filter off: trainer.run.divergence counts non-finite gradients on the device). On a GPU every host read is a
synchronization, so equal reads means no added synchronization (tests/gpu/test_step_syncs_gpu.py checks it with
CUDA's own sync debug mode).
The one addition allowed is the stop agreement's all-reduce, on its own CPU gloo group, once per step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
COUNTED_STEPS = {str(step) for step in range(3, 9)}  # step 1 logs; 2..8 neither log nor save before their end


def run_probe(folder: Path, nproc: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    script = str(HERE / "step_syncs.py")
    launch = [sys.executable, script] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), script,
    ]  # fmt: skip
    proc = subprocess.run([*launch, str(folder)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((folder / f"counts.{rank}.json").read_text()) for rank in range(nproc)]


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_step_reads_and_collects_what_plain_transformers_does(nproc: int, tmp_path: Path) -> None:
    for rank, result in enumerate(run_probe(tmp_path, nproc)):
        plain, ours = result["plain"], result["trainkit"]
        assert result["exit_code"] == 0
        assert set(plain) == set(ours) == COUNTED_STEPS, result
        for step in COUNTED_STEPS:
            mine, theirs = dict(ours[step]), dict(plain[step])
            stop_agreement = mine.pop("collective:other", 0)
            # trainkit turns Transformers' NaN/Inf loss filter off (its divergence guard counts on the device): it
            # may read less than plain, never more
            assert mine.pop("read", 0) <= theirs.pop("read", 0), f"rank {rank} step {step}: {ours[step]}, {plain[step]}"
            assert mine == theirs, f"rank {rank} step {step}: trainkit {ours[step]}, plain {plain[step]}"
            assert stop_agreement == (1 if nproc > 1 else 0), ours[step]
        # the counting sees host reads (plain's NaN/Inf filter reads the loss); the stop agreement's all-reduce above
        # shows it sees collectives (plain's own per-step token-count gather exists from transformers 4.5x on)
        assert all(plain[s].get("read") for s in COUNTED_STEPS)
