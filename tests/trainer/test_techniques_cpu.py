"""The playbook techniques that also run on a CPU, trained for real through `python -m trainer`.

bf16 autocast, fused AdamW, gradient checkpointing and torch.compile together in one run (compile's cold start
dominates, so one run covers all four); ZeRO-2 with CPU offload runs in the CPU image, where DeepSpeed's
cpu_adam is prebuilt (tests/images/test_image_deepspeed.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def _metrics(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def test_bf16_fused_adamw_grad_ckpt_and_compile_train(run_trainer, trainer_env, text_file):
    output = Path(trainer_env["TRAIN_OUTPUT_DIR"])
    env = {
        **trainer_env,
        "TRAIN_DATA": str(text_file),
        "TRAIN_PRECISION": "bf16",
        "TRAIN_OPTIM": "adamw_torch_fused",
        "TRAIN_GRAD_CKPT": "1",
        "TRAIN_COMPILE": "1",
        "TRAIN_SEQ_LEN": "64",
        "TRAIN_BATCH_SIZE": "4",
        "TRAIN_MAX_STEPS": "4",
        "TRAIN_LOG_STEPS": "1",
        "TRAIN_SAVE_STEPS": "4",
    }
    result = run_trainer([], env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]

    config = json.loads((output / "run_config.json").read_text())
    args = config["training_arguments"]
    assert args["bf16"] is True and args["optim"] == "adamw_torch_fused"
    assert config["decisions"]["compile"]["value"] is True and args["torch_compile"] is False  # not Transformers:
    assert "LlamaDecoderLayer layers compiled in place" in result.stderr  # each layer, by trainer.run.training_model
    rows = _metrics(output)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"], "four steps at this learning rate must lower the loss"
    assert (output / "final" / "config.json").is_file()


def test_fsdp_in_one_process_runs_as_a_world_of_one(run_trainer, trainer_env, text_file):
    """Transformers refuses FSDP outside distributed training; a lone `python -m trainer` is a world of one."""
    output = Path(trainer_env["TRAIN_OUTPUT_DIR"])
    env = {
        **trainer_env, "TRAIN_DATA": str(text_file), "TRAIN_FSDP": "full_shard", "TRAIN_SEQ_LEN": "32",
        "TRAIN_BATCH_SIZE": "2", "TRAIN_MAX_STEPS": "3", "TRAIN_SAVE_STEPS": "2", "TRAIN_LOG_STEPS": "1",
    }  # fmt: skip
    result = run_trainer([], env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "only works in distributed training" not in result.stderr
    config = json.loads((output / "run_config.json").read_text())
    assert config["training_arguments"]["fsdp"]
    assert "cpu_ram_efficient_loading" not in config["training_arguments"]["fsdp_config"]  # a preset: nothing to read
    assert "on CPUs accelerate does not shard" in config["decisions"]["fsdp"]["reason"]  # it says what really runs
    assert [r["step"] for r in _metrics(output)] == [1, 2, 3]
    assert (output / "checkpoint-2" / "trainkit_complete").is_file()
    assert (output / "final" / "config.json").is_file()


def test_qlora_trains_on_the_cpu(run_trainer, trainer_env, text_file):
    """TRAIN_QUANT=4bit with LoRA on a machine without a GPU: bitsandbytes' CPU backend quantizes the base (before
    issue 59 the loader asked for GPU 0: exit 1, `Cannot access accelerator device when none is available`)."""
    output = Path(trainer_env["TRAIN_OUTPUT_DIR"])
    env = {**trainer_env, "TRAIN_DATA": str(text_file), "TRAIN_QUANT": "4bit", "TRAIN_LORA": "1",
           "TRAIN_SEQ_LEN": "32", "TRAIN_BATCH_SIZE": "2", "TRAIN_MAX_STEPS": "2", "TRAIN_SAVE_STEPS": "2",
           "TRAIN_LOG_STEPS": "1"}  # fmt: skip
    result = run_trainer([], env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "4bit quantized on cpu" in result.stderr
    assert [r["step"] for r in _metrics(output)] == [1, 2] and (output / "final").is_dir()
