"""The fast path's switches on a GPU (issue 27), each a real `python -m trainer` run of the tiny preset whose losses
are compared with the plain path's (the same seed, data and batch): torch.compile on by default, non-blocking
copies from pinned memory, FlashAttention-4, Liger's kernels, the model built (and a model folder loaded) on its
GPU. Skipped without a CUDA GPU, and per switch without its package or GPU generation.

    .venv/bin/python -m pytest -q tests/gpu/test_gpu_speed.py -rs
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_gpu_paths import GPU_NAME, HAS_CUDA, decisions, metrics, needs, needs_bf16, train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible to torch)")]


def _capability() -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability() if HAS_CUDA else (0, 0)


def _has_distribution(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


needs_hopper = pytest.mark.skipif(HAS_CUDA and _capability() < (9, 0), reason=f"{GPU_NAME} is older than Hopper")
needs_fa4 = pytest.mark.skipif(HAS_CUDA and not _has_distribution("flash-attn-4"),
                               reason="flash_attention_4 needs flash-attn-4, which is not installed")  # fmt: skip


def corpus(tmp_path: Path, lines: int = 600) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog, again.\n" for i in range(lines)))
    return path


def losses(out: Path) -> list[float]:
    return [row["loss"] for row in metrics(out) if "loss" in row]


def assert_close(fast: list[float], plain: list[float], rel: float) -> None:
    assert len(fast) == len(plain) and fast, (fast, plain)
    assert fast == pytest.approx(plain, rel=rel), (fast, plain)


def test_compile_is_on_by_default_for_a_long_run_and_its_time_is_reported(tmp_path: Path) -> None:
    """TRAIN_MAX_STEPS=-1 (epochs) is a long run: auto compiles; the losses follow the eager run's."""
    data = corpus(tmp_path)
    fast, _ = train(tmp_path / "auto", data=data, max_steps=-1, epochs=1, precision="bf16")
    plain, _ = train(tmp_path / "eager", data=data, max_steps=-1, epochs=1, precision="bf16", compile=0)
    chosen = decisions(fast)
    assert chosen["compile"]["value"] is True and chosen["compile"]["reason"].startswith("auto: a GPU run")
    startup = json.loads((fast / "run_config.json").read_text())["startup"]
    assert startup["compile_s"] is not None and startup["compile_s"] > 0
    fast_losses, plain_losses = losses(fast), losses(plain)
    assert_close(fast_losses[:10], plain_losses[:10], rel=2e-2)  # bf16, fused kernels: not bit-exact
    assert sum(fast_losses[-5:]) == pytest.approx(sum(plain_losses[-5:]), rel=5e-2)  # and they end alike


def test_a_short_run_is_not_compiled_and_says_why(tmp_path: Path) -> None:
    out, _ = train(tmp_path, max_steps=4)
    assert "does not earn back the compilation" in decisions(out)["compile"]["reason"]


def test_non_blocking_copies_from_pinned_memory_train_the_same(tmp_path: Path) -> None:
    data = corpus(tmp_path)
    fast, _ = train(tmp_path / "async", data=data, max_steps=6)
    plain, _ = train(tmp_path / "sync", data=data, max_steps=6, pin_memory=0)
    config = json.loads((fast / "run_config.json").read_text())
    assert config["decisions"]["non_blocking"]["value"] is True
    assert config["training_arguments"]["accelerator_config"] == {"non_blocking": True}
    assert config["training_arguments"]["logging_nan_inf_filter"] is False
    assert decisions(plain)["non_blocking"]["value"] is False
    assert_close(losses(fast), losses(plain), rel=1e-3)  # the same numbers, copied asynchronously


@needs_bf16
@needs_hopper
@needs_fa4
def test_flash_attention_4_trains_like_sdpa(tmp_path: Path) -> None:
    data = corpus(tmp_path)
    fast, proc = train(tmp_path / "fa4", data=data, max_steps=6, precision="bf16", attn="flash_attention_4")
    plain, _ = train(tmp_path / "sdpa", data=data, max_steps=6, precision="bf16", attn="sdpa")
    assert "attention=flash_attention_4" in proc.stderr
    assert_close(losses(fast), losses(plain), rel=2e-2)


@needs("liger_kernel", "TRAIN_LIGER=1")
@needs_bf16
def test_liger_kernels_train_like_the_plain_modules(tmp_path: Path) -> None:
    data = corpus(tmp_path)
    fast, _ = train(tmp_path / "liger", data=data, max_steps=6, precision="bf16", liger=1)
    plain, _ = train(tmp_path / "plain", data=data, max_steps=6, precision="bf16", liger=0)
    config = json.loads((fast / "run_config.json").read_text())
    assert config["training_arguments"]["use_liger_kernel"] is True
    assert_close(losses(fast), losses(plain), rel=2e-2)


def test_the_preset_is_built_on_its_gpu_and_a_folder_loads_there(tmp_path: Path) -> None:
    """No fp32 copy on the host: the preset is allocated and initialised on cuda:0, and its saved folder is read
    straight onto the GPU; the folder's first loss is the preset's final weights' loss, on either path."""
    data = corpus(tmp_path)
    preset, proc = train(tmp_path / "preset", data=data, max_steps=4)
    assert "built on cuda:0" in proc.stderr
    assert json.loads((preset / "run_config.json").read_text())["startup"]["phases_s"]["model"] > 0
    loaded, proc = train(tmp_path / "folder", data=data, max_steps=2, model=preset / "final")
    assert "on cuda:0" in proc.stderr
    assert losses(loaded)[0] < losses(preset)[0]  # it starts from the trained weights, not from scratch
