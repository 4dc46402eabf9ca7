"""trainer/compat.py on described stacks (every row's versions) and on this venv's (the default row's)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib

from trainer import compat
from trainer.compat import Stack

VERSIONS = tomllib.loads((Path(__file__).resolve().parents[2] / "images" / "versions.toml").read_text())
ROWS = VERSIONS["cuda"]


def release(version: str | None) -> tuple[int, ...] | None:
    """(2, 1, 0) from "2.1.0a0+b5021ba" (NGC's torch) or "2.8.3.post2", (2, 11, 0) from "2.11" (a row whose source
    gives only the minor); None for nothing."""
    return tuple(int(p or 0) for p in re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version).groups()) if version else None


def row_stack(row: str) -> Stack:
    """A row's stack as versions.toml gives it: NGC's torch, the transformers pin (the row's own over the default), and
    the flash-attn pin, none where the row builds none (its base keeps its own; where NGC ships flash-attn 2 its own
    version stands in, and only the major matters to compat); the TRL and math-verify pins on Python 3.11+
    (pyproject's markers)."""
    facts = ROWS[row]
    pins = {**VERSIONS["packages"], **facts.get("packages", {})}
    flash_attn = None if "flash-attn" in facts.get("skip", {}) else pins["flash-attn"]
    on_311 = tuple(map(int, facts["python"].split("."))) >= (3, 11)
    trl, math_verify = (pins["trl"], pins["math-verify"]) if on_311 else (None, None)
    return Stack(release(facts["torch"]), release(pins["transformers"]), release(flash_attn), release(trl),
                 release(math_verify))  # fmt: skip


STACKS = {row: row_stack(row) for row in ROWS}
DEFAULT_ROW = VERSIONS["default_cuda"]


def switches(found: dict[str, str]) -> set[str]:
    """Attention and FSDP switches (optimizer names come from the installed transformers, not a described one)."""
    return {k for k in found if not k.startswith("TRAIN_OPTIM=")}


@pytest.mark.parametrize("row", STACKS)
def test_described_rows_match_versions_toml(row: str) -> None:
    assert switches(compat.unsupported(STACKS[row])) == switches(ROWS[row].get("unsupported", {}))


def test_this_venv_is_the_default_row_and_supports_everything() -> None:
    assert compat.stack().transformers_5 and compat.unsupported() == {}
    assert ROWS[DEFAULT_ROW].get("unsupported", {}) == {}


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
    from trainer.config.schema import TrainSettings
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
    with compat.resuming_from("/output/checkpoint-3", STACKS["12.4"]):
        assert hf_trainer.check_torch_load_is_safe is not guard
        hf_trainer.check_torch_load_is_safe()  # what transformers calls before torch.load: no refusal
    assert hf_trainer.check_torch_load_is_safe is guard
    for checkpoint, st in ((None, STACKS["12.4"]), ("/output/checkpoint-3", STACKS["12.8"])):
        with compat.resuming_from(checkpoint, st):
            assert hf_trainer.check_torch_load_is_safe is guard
