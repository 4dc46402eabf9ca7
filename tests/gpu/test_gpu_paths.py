"""GPU-only techniques, each a real `python -m trainer` run of a few steps on the tiny preset.

Skipped with a reason when there is no CUDA GPU, and per feature when its library (bitsandbytes, apex,
flash-attn, deepspeed) or hardware capability (bf16) is missing. Run on a GPU machine with:

    .venv/bin/python -m pytest -q tests/gpu -rs
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _cuda() -> tuple[bool, bool, str]:
    try:
        import torch
    except ImportError:
        return False, False, ""
    if not torch.cuda.is_available():
        return False, False, ""
    return True, torch.cuda.is_bf16_supported(), torch.cuda.get_device_name()


HAS_CUDA, HAS_BF16, GPU_NAME = _cuda()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible to torch)")]


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def needs(module: str, what: str):
    # Only judged with a GPU: without one the module-level mark gives the reason.
    return pytest.mark.skipif(
        HAS_CUDA and not has_module(module), reason=f"{what} needs {module}, which is not installed"
    )


needs_bf16 = pytest.mark.skipif(HAS_CUDA and not HAS_BF16, reason=f"{GPU_NAME} has no bf16")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(tmp_path: Path, timeout: int = 600, **train_vars: object) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    base = {"output_dir": out, "seq_len": 128, "batch_size": 4, "max_steps": 4, "log_steps": 1, "save_steps": 1000}
    # a value of None leaves the variable unset (the trainer's default)
    env.update({f"TRAIN_{k.upper()}": str(v) for k, v in {**base, **train_vars}.items() if v is not None})
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "trainer"], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    steps = int(env["TRAIN_MAX_STEPS"])
    assert (out / "final").is_dir() and (steps < 0 or (out / f"checkpoint-{steps}").is_dir())
    return out, proc


def decisions(out: Path) -> dict:
    return json.loads((out / "run_config.json").read_text())["decisions"]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_default_gpu_run_reports_memory_and_mfu(tmp_path: Path) -> None:
    from trainer.machine.peaks import peak_flops

    out, _ = train(tmp_path)
    rows = metrics(out)
    assert rows and all(r["peak_mem_bytes"] > 0 for r in rows)
    if peak_flops(GPU_NAME) is not None:
        assert all(0 < r["mfu"] < 1 for r in rows)
    else:
        assert all(r["mfu"] is None for r in rows)


@needs_bf16
def test_bf16(tmp_path: Path) -> None:
    out, _ = train(tmp_path, precision="bf16")
    assert decisions(out)["precision"]["value"] == "bf16"


def test_tf32(tmp_path: Path) -> None:
    out, _ = train(tmp_path, tf32=1, precision="fp32")
    assert decisions(out)["tf32"]["value"] in (True, 1, "1")


def test_adamw_torch_fused(tmp_path: Path) -> None:
    out, _ = train(tmp_path, optim="adamw_torch_fused")
    assert decisions(out)["optim"]["value"] == "adamw_torch_fused"


@needs("bitsandbytes", "adamw_bnb_8bit")
def test_adamw_bnb_8bit(tmp_path: Path) -> None:
    out, _ = train(tmp_path, optim="adamw_bnb_8bit")
    assert decisions(out)["optim"]["value"] == "adamw_bnb_8bit"


@needs("apex", "adamw_apex_fused")
def test_adamw_apex_fused(tmp_path: Path) -> None:
    if not (has_module("apex.optimizers") and has_module("amp_C")):  # the PyPI `apex` is another project
        pytest.skip("adamw_apex_fused needs apex built with its CUDA extensions (amp_C)")
    _, proc = train(tmp_path, optim="adamw_apex_fused")
    assert "apex FusedAdam" in proc.stderr


@needs("deepspeed", "ZeRO")
def test_zero2_with_cpu_offload(tmp_path: Path) -> None:
    # One process without a launcher: DeepSpeed still wants the torch.distributed rendezvous variables.
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    try:
        out, _ = train(tmp_path, zero_stage=2, zero_offload="cpu", precision="bf16" if HAS_BF16 else "fp16")
    finally:
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(name, None)
    config = json.loads((out / "run_config.json").read_text())
    assert config["deepspeed"]["zero_optimization"]["stage"] == 2
    assert config["deepspeed"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_torch_compile(tmp_path: Path) -> None:
    out, _ = train(tmp_path, compile=1)
    config = json.loads((out / "run_config.json").read_text())
    assert config["decisions"]["compile"]["value"] is True and "regional" in config["decisions"]["compile"]["reason"]


@needs("flash_attn", "flash_attention_2")
@needs_bf16
def test_flash_attention_2(tmp_path: Path) -> None:
    out, proc = train(tmp_path, attn="flash_attention_2", precision="bf16")
    assert decisions(out)["attn"]["value"] == "flash_attention_2"
    assert "attention=flash_attention_2" in proc.stderr


@needs("bitsandbytes", "QLoRA")
@needs("peft", "QLoRA")
def test_qlora_4bit(tmp_path: Path) -> None:
    out, proc = train(tmp_path, lora=1, quant="4bit", lora_r=8)
    assert "LoRA: r=8" in proc.stderr
    assert (out / "final" / "adapter_model.safetensors").is_file()  # 4-bit base: the adapter is the result


def test_profile_and_memory_snapshot(tmp_path: Path) -> None:
    out, _ = train(tmp_path, profile=1, memory_snapshot=1, max_steps=6)
    assert list((out / "profile").glob("*.pt.trace.json*"))
    summary = (out / "profile" / "summary-rank0.txt").read_text()
    assert "self_device_time_total" in summary or "self_cuda_time_total" in summary
    assert "CUDA" in summary  # the table's GPU time columns
    assert (out / "memory_snapshot.pickle").stat().st_size > 0


@needs_bf16
def test_auto_batch_searches_up_to_a_real_out_of_memory(tmp_path: Path) -> None:
    """TRAIN_AUTO_BATCH=1 with no TRAIN_BATCH_SIZE doubles from the default until CUDA runs out of memory, bisects,
    and trains at the batch found (the CPU tests stand in for the memory limit; here it is the GPU's own); the
    effective batch it chose is logged."""
    data = tmp_path / "data.txt"
    data.write_text("".join(f"line {i}: a sentence long enough to fill many blocks of tokens.\n" for i in range(40000)))
    out, proc = train(tmp_path, model="125m", seq_len=1024, batch_size=None, auto_batch=1, data=data, precision="bf16")
    decision = decisions(out)["batch_size"]
    assert decision["value"] > 8 and "out of memory" in decision["reason"], decision
    assert decisions(out)["grad_accum"]["value"] == 1
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["train_batch_size"] == decision["value"]
    assert "TRAIN_BATCH_SIZE was not set, so the search chose it" in proc.stderr


@needs_bf16
def test_auto_batch_probes_the_compiled_model_and_a_restart_reuses_its_result(tmp_path: Path) -> None:
    """With compile on, the search probes the compiled model (issue 42 item 1); peak_mem_bytes is the training
    steps' peak, not the out-of-memory probes' (item 2); the same run again takes the cached result (issue 34)."""
    import torch

    data = tmp_path / "data.txt"
    data.write_text("".join(f"line {i}: a sentence long enough to fill many blocks of tokens.\n" for i in range(40000)))
    run = {"model": "125m", "seq_len": 1024, "batch_size": None, "auto_batch": 1, "compile": 1, "data": data,
           "precision": "bf16"}  # fmt: skip
    out, _ = train(tmp_path, **run)
    first = decisions(out)["batch_size"]
    assert "probed compiled" in first["reason"] and "out of memory" in first["reason"], first
    total = torch.cuda.get_device_properties(0).total_memory
    assert max(r["peak_mem_bytes"] for r in metrics(out)) < 0.95 * total  # the probes came to the limit
    out, _ = train(tmp_path, resume="never", start_over=1, **run)
    again = decisions(out)["batch_size"]
    assert again["value"] == first["value"] and "cached result of an earlier search" in again["reason"], again


@needs_bf16
def test_auto_batch_keeps_the_effective_batch_the_user_set(tmp_path: Path) -> None:
    """TRAIN_BATCH_SIZE=2 x TRAIN_GRAD_ACCUM=16: the search (on by default on a GPU) raises the micro-batch and
    lowers the accumulation, keeping 32 sequences per optimizer step."""
    out, proc = train(tmp_path, model="125m", seq_len=512, batch_size=2, grad_accum=16, precision="bf16")
    chosen = decisions(out)
    assert chosen["auto_batch"]["value"] is True and chosen["auto_batch"]["reason"].startswith("auto: on")
    micro, accum = chosen["batch_size"]["value"], chosen["grad_accum"]["value"]
    assert micro * accum == 32 and micro > 2, chosen
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["train_batch_size"] == micro
    assert "effective batch 32 sequences per step" in proc.stderr
