"""TRAIN_PRECISION=fp8 (issue 49 item 6): refused with exit 2 where it cannot run (the CPU, GPUs without FP8 tensor
cores, a row whose torch is too old, without torchao, with sharding or adapters), decided with its reason on a
described Hopper GPU, and the conversion itself on the tiny preset's real module tree: which linear layers become
torchao's Float8Linear, and that the converted model still trains (this torch runs float8 matmuls on the CPU too,
so a forward and backward pass is real here, though the trainer refuses fp8 on a CPU: no speed to gain)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import base_env

from trainer import compat, config
from trainer.errors import ConfigError
from trainer.machine.hardware import Hardware

REPO = Path(__file__).resolve().parents[2]
H100 = Hardware(
    device="cuda", gpu_count=1, gpu_name="NVIDIA H100 80GB HBM3", capability=(9, 0), total_memory_bytes=80 * 2**30,
    bf16=True, tf32=True, libraries={"triton": True, "tensorboard": True, "torchao": True},
)  # fmt: skip
A100 = dataclasses.replace(H100, gpu_name="NVIDIA A100-SXM4-80GB", capability=(8, 0))
T4 = dataclasses.replace(H100, gpu_name="Tesla T4", capability=(7, 5), bf16=False, tf32=False)


def resolve(hw: Hardware, **env: str) -> config.RunConfig:
    settings = config.parse_settings({f"TRAIN_{k.upper()}": v for k, v in env.items()})
    return config.resolve(settings, hw, environ={}, import_heavy=False)


def test_fp8_on_the_cpu_exits_2_naming_the_machine_and_what_to_set(tmp_path: Path) -> None:
    env = {**base_env(), "PYTHONPATH": str(REPO), "TRAIN_PRECISION": "fp8", "TRAIN_OUTPUT_DIR": str(tmp_path / "o")}
    result = subprocess.run([sys.executable, "-m", "trainer"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "TRAIN_PRECISION=fp8 needs a GPU with FP8 tensor cores (compute capability 8.9+" in result.stderr
    assert "no CUDA GPU; set TRAIN_PRECISION=bf16 (or auto)" in result.stderr
    assert "Traceback" not in result.stderr and "model: preset" not in result.stderr  # refused before the model


@pytest.mark.parametrize(("hw", "instead"), [(A100, "TRAIN_PRECISION=bf16"), (T4, "TRAIN_PRECISION=fp16")])
def test_a_gpu_without_fp8_tensor_cores_is_named_with_what_to_set_instead(hw: Hardware, instead: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(hw, precision="fp8")
    assert f"{hw.gpu_name} (compute capability {hw.capability[0]}.{hw.capability[1]}) has none" in str(err.value)
    assert instead in str(err.value)


def test_on_hopper_fp8_runs_bf16_autocast_and_says_mfu_is_bf16_equivalent() -> None:
    cfg = resolve(H100, precision="fp8")
    d, ta = cfg.decisions, cfg.training_arguments
    assert d.precision.value == "fp8" and "bf16-equivalent" in d.precision.reason
    assert "not the LM head" in d.precision.reason and "tensorwise" in d.precision.reason
    assert ta["bf16"] is True and ta["fp16"] is False  # the float8 matmuls run inside bf16 autocast
    assert d.attn.value in ("sdpa", "flash_attention_2")  # attention computes in bf16, as with TRAIN_PRECISION=bf16


@pytest.mark.parametrize(
    ("env", "named"),
    [({"lora": "1"}, "TRAIN_LORA=1"), ({"fsdp": "full_shard"}, "TRAIN_FSDP=full_shard"),
     ({"zero_stage": "2"}, "DeepSpeed"), ({}, "needs torchao")],
)  # fmt: skip
def test_what_fp8_was_not_built_for_is_refused(env: dict[str, str], named: str) -> None:
    hw = H100 if env else dataclasses.replace(H100, libraries={"triton": True})
    with pytest.raises(ConfigError) as err:
        resolve(hw, precision="fp8", **env)
    assert named in str(err.value) and "TRAIN_PRECISION=bf16" in str(err.value)


def test_a_row_whose_torch_is_too_old_refuses_fp8_naming_the_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VERSION", "12.4.1")  # as NGC 24.05 sets it
    settings = SimpleNamespace(attn="sdpa", fsdp="none", optim="auto", method="sft", precision="fp8")
    (problem,) = compat.unsupported_problems(settings, compat.Stack((2, 4, 0), (4, 57, 6), (2, 5, 8), None))
    assert problem.startswith("TRAIN_PRECISION=fp8 is not supported on the CUDA 12.4 row (torch 2.4.0")
    assert "needs torch >= 2.6" in problem
    assert "TRAIN_PRECISION=fp8" not in compat.unsupported(compat.Stack((2, 6, 0), (5, 23, 0), None))


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(preset_config("tiny", len(tok), 64, tok))


def test_the_decoders_linear_layers_convert_and_the_lm_head_does_not(tiny: torch.nn.Module) -> None:
    pytest.importorskip("torchao")
    from trainer.model.float8 import convert_to_fp8, fp8_layer_names

    model = _copy(tiny)
    model.add_module("odd", torch.nn.Linear(256, 24))  # 24 is no multiple of 16: float8 matmuls refuse it
    keys = set(model.state_dict())
    assert "odd" not in fp8_layer_names(model) and "lm_head" not in fp8_layer_names(model)
    converted = convert_to_fp8(model)
    attention, mlp = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")
    expected = [f"model.layers.{i}.self_attn.{p}" for p in attention for i in range(4)]
    expected += [f"model.layers.{i}.mlp.{p}" for p in mlp for i in range(4)]
    assert converted == sorted(expected)
    kinds = {name: type(module).__name__ for name, module in model.named_modules()}
    assert {kinds[name] for name in converted} == {"Float8Linear"}
    assert kinds["lm_head"] == kinds["odd"] == "Linear"
    assert set(model.state_dict()) == keys  # checkpoints and final/ hold the same fp32 weights
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the master weights


def test_the_converted_model_trains_within_noise_of_bf16(tiny: torch.nn.Module) -> None:
    """The same weights and batch: the loss under bf16 autocast with and without the float8 layers, and every
    converted layer's fp32 weight gets a gradient."""
    pytest.importorskip("torchao")
    from trainer.model.float8 import convert_to_fp8

    batch = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(1))
    losses = {}
    for fp8 in (False, True):
        model = _copy(tiny)
        converted = convert_to_fp8(model) if fp8 else []
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        losses[fp8] = loss.item()
        modules = dict(model.named_modules())
        assert all(modules[name].weight.grad is not None for name in converted)
    assert abs(losses[True] - losses[False]) < 0.02 * losses[False], losses


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(model)
