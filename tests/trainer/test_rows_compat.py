"""trainer/compat.py on described stacks (every row's versions) and on this venv's (the default row's)."""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer import compat, library_patches
from trainer.config.schema import TrainSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import matrix

MATRIX = matrix.load()
STACKS = {row: entry.stack for row, entry in MATRIX.entries.items()}  # each row's stack as versions.toml gives it
DEFAULT_ROW = MATRIX.default_cuda
METHODS = typing.get_args(TrainSettings.model_fields["method"].annotation)
NO_TRL = {f"TRAIN_METHOD={m}" for m in METHODS if m != "sft"} | {"TRAIN_REWARD=math"}  # every method but SFT is TRL's
NOT_ON_TRANSFORMERS_4 = {"TRAIN_ATTN=flash_attention_4", "TRAIN_FSDP=full_shard", "TRAIN_FSDP=shard_grad_op",
                         compat.IMAGES,  # records with images: transformers >= 5.17's processor offsets
                         "TRAIN_MODEL=tiny-moe"}  # Qwen3-MoE's fused experts
# What the Python 3.10 rows refused when versions.toml still typed it (issue 54 derived it from their stacks).
REFUSED = {
    "12.1": {"TRAIN_PRECISION=fp8", "TRAIN_ATTN=flash_attention_2", *NOT_ON_TRANSFORMERS_4, *NO_TRL,
             *(f"TRAIN_OPTIM={o}" for o in ("adamw_torch_8bit", "schedule_free_radam", "apollo_adamw",
                                            "apollo_adamw_layerwise", "stable_adamw"))},
    "12.4": {"TRAIN_PRECISION=fp8", *NOT_ON_TRANSFORMERS_4, *NO_TRL},
}  # fmt: skip


@pytest.mark.parametrize("row", sorted(REFUSED))
def test_described_rows_refuse_what_they_refused(row: str) -> None:
    assert set(compat.unsupported(STACKS[row])) == REFUSED[row]
    assert set(MATRIX.entries[row].unsupported) == REFUSED[row]  # docs/images.md's column


def test_a_row_with_python_3_11_gets_trl_and_its_methods() -> None:
    """A row is its stack fields alone: the same torch and transformers on Python 3.11 install TRL (pyproject's
    marker), so the methods and the math reward are no longer refused; multi-turn RL then is, for its
    transformers (no response templates before 5.13)."""
    entry = dataclasses.replace(MATRIX.entries["12.4"], python="3.11")
    tools = {"TRAIN_RL_TOOLS", "TRAIN_RL_ENVIRONMENT"}
    assert entry.stack.trl is not None and set(entry.unsupported) == (REFUSED["12.4"] - NO_TRL) | tools


def test_this_venv_is_the_default_row_and_supports_everything() -> None:
    assert compat.stack().transformers_5 and compat.unsupported() == {}
    assert MATRIX.entries[DEFAULT_ROW].unsupported == {}


@pytest.mark.parametrize(
    ("row", "dtype", "checkpointing"),
    [("12.1", "torch_dtype", "gradient_checkpointing"), ("12.4", "dtype", "gradient_checkpointing"),
     ("12.8", "dtype", "activation_checkpointing")],
)  # fmt: skip
def test_argument_names_per_row(row: str, dtype: str, checkpointing: str) -> None:
    assert STACKS[row].dtype_kwarg == dtype and STACKS[row].checkpointing_name == checkpointing


def test_fsdp_arguments_follow_the_transformers_version() -> None:
    v5 = compat.fsdp_arguments("full_shard", "LlamaDecoderLayer", False, STACKS["12.8"])
    assert v5["fsdp"] is True and v5["fsdp_config"]["version"] == 2 and v5["fsdp_config"]["reshard_after_forward"]
    v4 = compat.fsdp_arguments("no_shard", None, False, STACKS["12.4"])
    assert v4 == {"fsdp": "no_shard auto_wrap", "fsdp_config": {}}


def test_the_refusal_names_the_row_and_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VERSION", "12.1.1")  # as NGC 23.07 sets it
    settings = SimpleNamespace(
        attn="flash_attention_2", fsdp="shard_grad_op", optim="auto", method="sft", precision="auto"
    )
    problems = compat.unsupported_problems(settings, STACKS["12.1"])
    assert problems[0].startswith("TRAIN_ATTN=flash_attention_2 is not supported on the CUDA 12.1 row (torch 2.1.0")
    assert "flash-attn 2 needs torch >= 2.2" in problems[0]
    assert problems[1].startswith("TRAIN_FSDP=shard_grad_op is not supported") and "transformers 5" in problems[1]


def test_auto_attention_never_picks_flash_attention_2_where_the_row_has_flash_attn_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NGC 23.07 ships flash-attn 1 (importable as flash_attn): on an A100 in bf16, auto must still pick sdpa."""
    from trainer.config.speed import decide_attn
    from trainer.machine.hardware import Hardware

    a100 = Hardware(device="cuda", gpu_count=1, capability=(8, 0), bf16=True, libraries={"flash_attn": True})
    settings = TrainSettings(attn="auto")
    assert decide_attn(settings, a100, "bf16").value == "flash_attention_2"  # the default row
    flash_attn_1 = dataclasses.replace(STACKS["12.1"], flash_attn=(1, 0, 7))  # the row keeps NGC 23.07's own
    monkeypatch.setattr(compat, "stack", lambda: flash_attn_1)
    decision = decide_attn(settings, a100, "bf16")
    assert decision.value == "sdpa" and "no flash-attn 2 on this stack" in decision.reason


def test_only_the_12_4_row_meets_transformers_refusing_torch_load() -> None:
    """transformers 4.52+ on torch < 2.6 refuses the optimizer state of every resume (the 12.4 stand-in's resume test
    failed on it); the adapter lifts that guard for the resumed checkpoint there, and nowhere else."""
    assert [row for row, st in STACKS.items() if st.refuses_torch_load] == ["12.4"]


def test_the_torch_load_guard_is_lifted_only_around_a_resume() -> None:
    import transformers.trainer as hf_trainer

    guard = hf_trainer.check_torch_load_is_safe
    with library_patches.resuming_from("/output/checkpoint-3", STACKS["12.4"]):
        assert hf_trainer.check_torch_load_is_safe is not guard
        hf_trainer.check_torch_load_is_safe()  # what transformers calls before torch.load: no refusal
    assert hf_trainer.check_torch_load_is_safe is guard
    for checkpoint, st in ((None, STACKS["12.4"]), ("/output/checkpoint-3", STACKS["12.8"])):
        with library_patches.resuming_from(checkpoint, st):
            assert hf_trainer.check_torch_load_is_safe is guard
