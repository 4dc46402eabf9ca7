"""`auto` picks the fast path on a GPU (issue 27): torch.compile, the batch search, attention, Liger kernels and the
host-device syncs, each with its reason; off with the reason on CPU and where it has not been measured.

Decisions for GPUs this machine does not have are resolved in-process on a described `Hardware` (no torch), as in
test_config.py; the split of the effective batch is the real function the run calls.
"""

from __future__ import annotations

import dataclasses
import tempfile

import pytest

from trainer import compat, config
from trainer.config import speed
from trainer.errors import ConfigError
from trainer.machine.hardware import Hardware
from trainer.run.batch_search import split_effective

H100 = Hardware(
    device="cuda", gpu_count=1, gpu_name="NVIDIA H100 80GB HBM3", capability=(9, 0), total_memory_bytes=80 * 2**30,
    bf16=True, tf32=True, libraries={"triton": True, "tensorboard": True},
)  # fmt: skip
A100 = dataclasses.replace(H100, gpu_name="NVIDIA A100-SXM4-80GB", capability=(8, 0))
CPU = Hardware(device="cpu", cpu_count=2, cxx_compiler="/usr/bin/g++")


def with_libraries(hw: Hardware, **libraries: bool) -> Hardware:
    return dataclasses.replace(hw, libraries={**hw.libraries, **libraries})


def resolve(hw: Hardware, **env: str) -> config.RunConfig:
    settings = config.parse_settings({f"TRAIN_{k.upper()}": v for k, v in env.items()})
    return config.resolve(settings, hw, environ={}, import_heavy=False)


def test_a_long_gpu_run_gets_the_fast_path_with_its_reasons() -> None:
    cfg = resolve(H100)
    d, ta = cfg.decisions, cfg.training_arguments
    if compat.compile_default_problem() is None:  # this venv's torch is the one compat judges
        assert d.compile.value is True and d.compile.reason.startswith("auto: a GPU run (epochs)")
        assert "regional: each decoder layer compiled in place" in d.compile.reason
        # the trainer compiles the layers itself (trainer.run.training_model); Transformers does not compile the whole
        assert ta["torch_compile"] is False and ta["dataloader_drop_last"] is True
    assert d.auto_batch.value is True and d.auto_batch.reason.startswith("auto: on")
    assert "with no accumulation" in d.batch_size.reason  # TRAIN_BATCH_SIZE not set: the search chooses it
    assert d.non_blocking.value is True and ta["accelerator_config"] == {"non_blocking": True}
    assert d.nan_inf_filter.value is False and ta["logging_nan_inf_filter"] is False
    assert "synchronization" in d.nan_inf_filter.reason
    assert d.liger.value is False and d.liger.reason == "auto: off (not measured faster on hopper GPUs yet; " \
        "docs/benchmarks.md)"  # fmt: skip
    assert d.attn.value == "sdpa" and "not measured on hopper GPUs yet" in d.attn.reason


def test_cpu_keeps_every_speed_auto_off_and_says_why() -> None:
    cfg = resolve(CPU)
    d, ta = cfg.decisions, cfg.training_arguments
    assert d.compile == config.Decision(False, "auto: off (no GPU: on CPU compiling takes longer than it saves in "
                                               "most runs)")  # fmt: skip
    assert ta["torch_compile"] is False and "torch_compile_mode" not in ta
    assert d.auto_batch.value is False and "no GPU" in d.auto_batch.reason
    assert d.non_blocking.value is False and "accelerator_config" not in ta
    assert d.nan_inf_filter.value is False and ta["logging_nan_inf_filter"] is False  # TRAIN_ON_NAN sees the NaN
    assert d.liger == config.Decision(False, "auto: off (no GPU)") and ta["use_liger_kernel"] is False
    assert resolve(CPU, compile="1").decisions.compile.reason.startswith("set by TRAIN_COMPILE")


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"max_steps": "50"}, "a run of 50 steps (< 200) does not earn back the compilation"),
        ({"zero_stage": "2"}, "not measured with DeepSpeed"),
        ({"fsdp": "full_shard"}, "not measured with TRAIN_FSDP=full_shard"),
    ],
)
def test_compile_auto_stays_off_where_it_does_not_pay(env: dict[str, str], why: str) -> None:
    decision = resolve(H100, **env).decisions.compile
    assert decision.value is False and why in decision.reason


def test_with_fsdp_accelerate_compiles_each_block_after_wrapping() -> None:
    cfg = resolve(H100, compile="1", fsdp="full_shard")
    assert "by Accelerate, regional" in cfg.decisions.compile.reason
    ta = cfg.training_arguments
    assert ta["torch_compile"] is True and ta["torch_compile_backend"] == "inductor" and ta["dataloader_drop_last"]


def test_compile_auto_asks_compat_whether_the_stack_is_known_to_work() -> None:
    old = compat.Stack(torch=(2, 4, 0), transformers=(4, 57, 6), flash_attn=None)
    assert "from torch 2.6" in (compat.compile_default_problem(old) or "")
    assert compat.compile_default_problem(compat.Stack(torch=(2, 6, 0), transformers=(5, 23), flash_attn=None)) is None
    triton_missing = with_libraries(H100, triton=False)
    assert "needs triton" in resolve(triton_missing).decisions.compile.reason


def test_the_batch_search_is_off_with_deepspeed_and_keeps_a_set_effective_batch() -> None:
    assert resolve(H100, zero_stage="2").decisions.auto_batch.value is False
    kept = resolve(H100, batch_size="4", grad_accum="8").decisions.batch_size.reason
    assert "keeping the effective batch TRAIN_BATCH_SIZE x TRAIN_GRAD_ACCUM = 32" in kept
    assert resolve(H100, auto_batch="0").decisions.auto_batch == config.Decision(False, "set by TRAIN_AUTO_BATCH=0")


@pytest.mark.parametrize(
    ("effective", "largest", "split"),
    [(32, 12, (8, 4)), (32, 64, (32, 1)), (6, 4, (3, 2)), (7, 6, (1, 7)), (8, 8, (8, 1))],
)
def test_split_effective_keeps_the_product(effective: int, largest: int, split: tuple[int, int]) -> None:
    assert split_effective(effective, largest) == split


def test_flash_attention_4_is_a_train_attn_value_with_clear_refusals() -> None:
    fa4 = with_libraries(H100, flash_attn_4=True)
    attn = resolve(fa4, attn="flash_attention_4").decisions.attn
    assert attn.value == "flash_attention_4" and attn.reason.startswith("set by TRAIN_ATTN; packed records: one row")
    assert "cu_seq_lens" in attn.reason  # the varlen kernel gets the boundaries (trainer.model.packed_attention)
    refusals = [
        (H100, {}, "needs the flash-attn-4 package"),
        (with_libraries(A100, flash_attn_4=True), {}, "needs a Hopper or newer GPU"),
        (fa4, {"precision": "fp32"}, "works in fp16/bf16 only"),
    ]
    for hw, env, expected in refusals:
        with pytest.raises(ConfigError) as info:
            resolve(hw, attn="flash_attention_4", **env)
        assert expected in info.value.message
    assert resolve(fa4).decisions.attn.value == "sdpa"  # installed, but auto waits for the measurement


def test_auto_attention_follows_the_measured_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speed, "MEASURED_ATTENTION", {"hopper": "flash_attention_4"})
    chosen = resolve(with_libraries(H100, flash_attn_4=True)).decisions.attn
    assert chosen.value == "flash_attention_4"
    assert chosen.reason.startswith("auto: measured fastest on hopper GPUs (docs/benchmarks.md); packed records:")
    assert resolve(H100).decisions.attn.value == "sdpa"  # measured, but not installed here: the safe choice
    reason = resolve(A100).decisions.attn.reason
    assert "not measured on ampere GPUs yet (docs/benchmarks.md); plain text gets no mask" in reason


def test_liger_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    liger = with_libraries(H100, liger_kernel=True)
    cfg = resolve(liger, liger="1")
    assert cfg.decisions.liger.value is True and cfg.training_arguments["use_liger_kernel"] is True
    for hw, expected in ((H100, "needs the liger-kernel package"), (with_libraries(CPU, liger_kernel=True),
                                                                    "needs a CUDA GPU")):  # fmt: skip
        with pytest.raises(ConfigError) as info:
            resolve(hw, liger="1")
        assert expected in info.value.message
    monkeypatch.setattr(speed, "MEASURED_LIGER", frozenset({"hopper"}))
    assert resolve(liger).decisions.liger.value is True
    assert "liger-kernel is not installed" in resolve(H100).decisions.liger.reason


def test_liger_refuses_a_model_it_does_not_patch(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Liger (triton kernels: cannot run on this CPU machine) stands in as its registry of patched model types."""
    import sys
    import types

    registry = types.ModuleType("liger_kernel.transformers.monkey_patch")
    registry.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": None, "mistral": None}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", registry)
    folder = tmp_path / "gpt2-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    liger = with_libraries(H100, liger_kernel=True)
    assert resolve(liger, liger="1").decisions.liger.value is True  # the presets are Llamas
    with pytest.raises(ConfigError) as info:
        resolve(liger, liger="1", model=str(folder))
    assert "Liger has no kernels for this model's type 'gpt2' (it patches llama, mistral)" in info.value.message


def test_old_rows_refuse_flash_attention_4_before_torch() -> None:
    old = compat.Stack(torch=(2, 4, 0), transformers=(4, 57, 6), flash_attn=(2, 6, 3))
    assert "TRAIN_ATTN=flash_attention_4" in compat.unsupported(old)
    assert "TRAIN_ATTN=flash_attention_4" not in compat.unsupported(compat.Stack((2, 11), (5, 23), None))


def test_compile_caches_go_to_the_cache_volume_unless_the_user_chose() -> None:
    """The images set /cache/inductor and /cache/triton (kept); from source they go beside HF_HOME, so a restarted
    run and the next one reuse the compiled kernels."""
    env = speed.compile_environment({"HF_HOME": "/vol/huggingface"}, "layers")
    assert env == {"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "1",
                   "TORCHINDUCTOR_CACHE_DIR": "/vol/torch-compile/inductor",
                   "TRITON_CACHE_DIR": "/vol/torch-compile/triton"}  # fmt: skip
    torchs_own = {"HF_HOME": "/vol/huggingface",
                  "TORCHINDUCTOR_CACHE_DIR": f"{tempfile.gettempdir()}/torchinductor_root"}  # fmt: skip
    assert speed.compile_environment(torchs_own, "layers") == env  # torch's default is nobody's choice
    image = {"HF_HOME": "/cache/huggingface", "TORCHINDUCTOR_CACHE_DIR": "/cache/inductor",
             "TRITON_CACHE_DIR": "/cache/triton"}  # fmt: skip
    whole = speed.compile_environment(image, "model")  # TRAIN_COMPILE_SCOPE=model: Accelerate compiles it whole
    assert whole == {"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "0", "TORCHINDUCTOR_CACHE_DIR": "/cache/inductor",
                     "TRITON_CACHE_DIR": "/cache/triton"}  # fmt: skip
