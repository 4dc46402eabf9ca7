"""What a finished `python -m trainer` run leaves in TRAIN_OUTPUT_DIR (docs/architecture.md, "Outputs")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.checkpoint_record import COMPLETE_MARKER
from trainer.machine.peaks import peak_flops
from trainer.run.metrics import METRIC_KEYS, flops_per_token, matmul_params

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("outputs")
    data = tmp / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"text": f"Record {i}: outputs should be complete."}) + "\n" for i in range(200))
    )
    out = tmp / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    env.update(
        TRAIN_DATA=str(data), TRAIN_OUTPUT_DIR=str(out), TRAIN_SEQ_LEN="32", TRAIN_BATCH_SIZE="2",
        TRAIN_MAX_STEPS=str(STEPS), TRAIN_SAVE_STEPS="1", TRAIN_SAVE_TOTAL_LIMIT="2",
        TRAIN_LOG_STEPS="2", TRAIN_PROFILE="1", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
        HF_HUB_TOKEN="hf_secretsecretsecret",
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "trainer"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_checkpoints_are_complete_and_rotated(finished_run) -> None:
    out, _ = finished_run
    names = sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", ".tmp-")))
    assert names == ["checkpoint-3", "checkpoint-4"]  # save_total_limit=2, no leftovers
    for name in names:
        folder = out / name
        assert (folder / COMPLETE_MARKER).is_file()
        for needed in ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth"):
            assert (folder / needed).is_file(), f"{name}/{needed}"


def test_the_thread_decision_is_logged_with_its_reason(finished_run) -> None:
    """trainer/machine/threads.py's line, once, before the run's work: this run's OMP_NUM_THREADS=1 kept as the
    user's, and idle OpenMP threads asleep (unless the caller set a wait policy)."""
    _, proc = finished_run
    assert proc.stderr.count(" INFO threads: 1 per process (OMP_NUM_THREADS=1, yours); ") == 1, proc.stderr[:3000]
    assert "OMP_WAIT_POLICY" in os.environ or "idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE)" in proc.stderr
    assert proc.stderr.index(" INFO threads: ") < proc.stderr.index(" INFO model: ")


def test_final_model_and_tokenizer_load_with_from_pretrained(finished_run) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = finished_run
    model = AutoModelForCausalLM.from_pretrained(out / "final", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out / "final", local_files_only=True)
    ids = tok("Record 1:", return_tensors="pt")["input_ids"]
    assert ids.tolist()[0] == list(b"Record 1:")  # the byte-level tokenizer came back
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape[:2] == ids.shape and torch.isfinite(logits).all()


def test_metrics_jsonl_has_exactly_the_contract_keys(finished_run) -> None:
    out, _ = finished_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 4]  # logging_first_step, then every 2 steps
    for row in rows:
        assert tuple(row) == METRIC_KEYS
        assert row["mfu"] is None  # CPU
        assert row["loss"] > 0 and row["lr"] >= 0 and row["grad_norm"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * 32)
        assert row["samples_per_s"] == pytest.approx(2 / row["step_time_s"])
        assert row["peak_mem_bytes"] > 10**7 and row["time"] > 1.7e9


def test_run_config_tensorboard_logs_and_profiler_trace(finished_run) -> None:
    out, _ = finished_run
    assert list((out / "profile").glob("*.pt.trace.json"))
    summary = (out / "profile" / "summary-rank0.txt").read_text()
    assert "self_cpu_time_total" in summary and "aten::" in summary
    config = json.loads((out / "run_config.json").read_text())
    assert config["training_arguments"]["max_steps"] == STEPS
    assert "hf_secretsecretsecret" not in (out / "run_config.json").read_text()
    assert list((out / "runs").rglob("events.out.tfevents.*"))


def test_console_shows_progress_and_parameter_count(finished_run) -> None:
    _, proc = finished_run
    assert "parameters: 3,246,336 total" in proc.stderr
    assert f"{STEPS}/{STEPS}" in proc.stderr  # tqdm progress bar
    # torchao (installed for TRAIN_PRECISION=fp8, imported by Transformers) warns about kernels it cannot load here
    assert "Failed to load" not in proc.stderr and "Enum subclass" not in proc.stderr


def test_lora_run_leaves_a_merged_model_and_the_adapter(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    env.update(
        TRAIN_OUTPUT_DIR=str(out), TRAIN_SEQ_LEN="32", TRAIN_BATCH_SIZE="2",
        TRAIN_MAX_STEPS="2", TRAIN_LORA="1", TRAIN_LORA_R="4", TRAIN_GRAD_CKPT="1", PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "trainer"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LoRA: r=4" in proc.stderr and "trainable (" in proc.stderr
    assert (out / "final" / "adapter" / "adapter_model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(out / "final", local_files_only=True)
    assert not any("lora" in name for name, _ in model.named_parameters())


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA H200", 989), ("NVIDIA H200 NVL", 835),
        ("NVIDIA A100-SXM4-80GB", 312), ("NVIDIA A10G", None), ("NVIDIA GeForce RTX 3090", None), (None, None),
    ],
)  # fmt: skip
def test_peak_flops_table(name: str | None, tflops: int | None) -> None:
    assert peak_flops(name) == (tflops * 1e12 if tflops else None)


def test_flops_per_token_counts_matmul_parameters_and_attention() -> None:
    from transformers import AutoModelForCausalLM

    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    model = AutoModelForCausalLM.from_config(preset_config("tiny", len(tok), 64, tok))
    n = sum(p.numel() for p in model.parameters())  # tied: the embedding is counted once, as the LM head
    assert matmul_params(model) == n
    assert flops_per_token(model, 64) == 6 * n + 12 * 4 * 256 * 64


def test_lora_flops_skip_the_weight_gradients_of_frozen_weights() -> None:
    """Frozen weights need the input gradient (2N) but not the weight gradient: LoRA is ~4N per token, not 6N."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    model = AutoModelForCausalLM.from_config(preset_config("tiny", len(tok), 64, tok))
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    n = matmul_params(lora)  # the frozen base and the adapters
    adapters = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert matmul_params(lora, trainable_only=True) == adapters < n / 50
    assert flops_per_token(lora, 64) == 4 * n + 2 * adapters + 12 * 4 * 256 * 64
    assert flops_per_token(lora, 64) < 0.7 * (6 * n + 12 * 4 * 256 * 64)


def test_fused_adam_takes_the_adam_flags_of_train_args(tmp_path: Path) -> None:
    """apex FusedAdam (GPU only) gets --adam_beta1/--adam_beta2/--adam_epsilon, not its own defaults."""
    from transformers import TrainingArguments

    from trainer.run.kit import fused_adam_kwargs
    from trainer.transformers_names import parse_train_args

    user = parse_train_args(["--adam_beta2", "0.95", "--adam_epsilon", "1e-6", "--weight_decay", "0.1"])
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, learning_rate=2e-4, **user)
    assert fused_adam_kwargs(args) == {
        "lr": 2e-4, "betas": (0.9, 0.95), "eps": 1e-6, "weight_decay": 0.1, "adam_w_mode": True,
    }  # fmt: skip


def test_one_process_uses_one_gpu(tmp_path: Path) -> None:
    """Outside torch.distributed Transformers counts every visible GPU into n_gpu and wraps the model in
    nn.DataParallel; one trainkit process uses one GPU. (The GPU count is what Transformers would have seen on
    a 4-GPU node; the rule under test is trainkit's.)"""
    from transformers import TrainingArguments

    from trainer.config.training_arguments import one_gpu_per_process

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    args._n_gpu = 4
    assert one_gpu_per_process(args).n_gpu == 1
    assert args.train_batch_size == args.per_device_train_batch_size



def test_zero_offload_runs_deepspeeds_optimizer_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """With ZeRO offload DeepSpeed's CPU Adam runs; TRAIN_OPTIM=adamw_apex_fused must neither be built nor logged."""
    from trainer import config
    from trainer.machine.hardware import Hardware
    from trainer.run.kit import optimizer_override

    gpu = Hardware(device="cuda", gpu_count=1, gpu_name="NVIDIA A100-SXM4-80GB", capability=(8, 0), bf16=True)
    env = {"TRAIN_ZERO_STAGE": "2", "TRAIN_ZERO_OFFLOAD": "cpu", "TRAIN_OPTIM": "adamw_apex_fused"}
    cfg = config.resolve(config.parse_settings(env), gpu, environ={}, import_heavy=False)
    with caplog.at_level("INFO", logger="trainer"):
        assert optimizer_override(cfg, args=None) == {}
    assert "DeepSpeed's own" in caplog.text and "TRAIN_OPTIM=adamw_apex_fused is not used" in caplog.text
    assert "apex" not in caplog.text.replace("TRAIN_OPTIM=adamw_apex_fused", "")


def test_qlora_under_fsdp_stores_4bit_weights_shardably_and_lets_fsdp_place_them() -> None:
    """FSDP shards parameters of the storage dtype: 4-bit weights kept as uint8 stay whole on every rank, and a
    device_map would fight FSDP's own placement. Without FSDP, the model goes to this rank's GPU as before."""
    from dataclasses import replace

    import torch

    from trainer.model.loading import LoadHow, pretrained_kwargs

    qlora = LoadHow(dtype="bfloat16", quant="4bit", double_quant=True, compute="bfloat16")
    fsdp = pretrained_kwargs(replace(qlora, shardable=True))
    assert fsdp["quantization_config"].bnb_4bit_quant_storage == torch.bfloat16 and "device_map" not in fsdp
    alone = pretrained_kwargs(replace(qlora, device=0))
    assert alone["quantization_config"].bnb_4bit_quant_storage == torch.uint8 and alone["device_map"] == {"": 0}
