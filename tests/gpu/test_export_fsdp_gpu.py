"""`python -m trainer export` of an FSDP checkpoint: accelerate shards only GPU worlds (on CPUs the ranks train DDP
copies), so the sharded state dict (pytorch_model_fsdp_0/, torch DCP) exists only here. A world of one GPU is enough
for the checkpoint's format; the exported folder must hold the weights final/ holds.

    .venv/bin/python -m pytest -q tests/gpu/test_export_fsdp_gpu.py -rs
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu_paths import HAS_CUDA

REPO = Path(__file__).resolve().parents[2]



pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible to torch)")]


def _trainer(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, "-m", "trainer", *args], env=full, cwd=REPO, capture_output=True,
                          text=True, timeout=900, check=False)  # fmt: skip


def test_fsdp_checkpoint_exports_to_the_weights_final_holds(tmp_path) -> None:
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "output"
    env = {"TRAIN_OUTPUT_DIR": str(out), "TRAIN_FSDP": "full_shard", "TRAIN_MAX_STEPS": "2", "TRAIN_SAVE_STEPS": "2",
           "TRAIN_SEQ_LEN": "64", "TRAIN_BATCH_SIZE": "2", "TRAIN_PRECISION": "fp32"}  # fmt: skip
    run = _trainer([], env)
    assert run.returncode == 0, run.stderr[-4000:]
    checkpoint = out / "checkpoint-2"
    shards = list(checkpoint.glob("pytorch_model_fsdp_*"))
    assert shards, f"no FSDP sharded state dict in {sorted(p.name for p in checkpoint.iterdir())}"
    exported = _trainer(["export", str(checkpoint), str(tmp_path / "exported")], env)
    assert exported.returncode == 0, exported.stderr[-4000:]
    assert "merge_fsdp_weights" in exported.stderr
    weights = load_file(tmp_path / "exported" / "model.safetensors")
    final = load_file(out / "final" / "model.safetensors")
    shared = sorted(set(weights) & set(final))
    assert len(shared) >= len(final) - 1
    assert all(torch.allclose(weights[k].float(), final[k].float()) for k in shared)
