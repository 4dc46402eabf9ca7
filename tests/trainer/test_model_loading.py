"""Loading a model folder does not waste memory (issue 10, item 11); real `python -m trainer` runs on the CPU.

- LoRA: the frozen base weights load in the compute dtype (bf16 here, CPU autocast), half of fp32; the adapters
  still train in fp32. Seen in what the run saves: the merged `final/` model holds bf16 weights, the adapter fp32.
- Full fine-tuning keeps fp32 master weights (mixed precision updates fp32 weights): `final/` holds fp32.
- FSDP: TrainingArguments carry `cpu_ram_efficient_loading` (rank 0's weights broadcast when FSDP wraps the model),
  and a 2-process gloo run with TRAIN_FSDP trains. On CPUs accelerate builds no FSDP plugin and runs the ranks as
  DDP, so that run proves the arguments are accepted, not sharding. Whether the other ranks skip reading the folder
  depends on the transformers version (trainer.compat.fsdp_arguments); nothing here measures host RAM.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainer import compat


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset saved as a Hugging Face folder in fp32 (no tokenizer: the byte-level one is used)."""
    from transformers import AutoModelForCausalLM

    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    folder = tmp_path_factory.mktemp("models") / "tiny-fp32"
    tok = byte_level_tokenizer()
    AutoModelForCausalLM.from_config(preset_config("tiny", len(tok), 32, tok)).save_pretrained(folder)
    return folder


def _dtypes(folder: Path) -> set[str]:
    """The tensor dtypes in a folder's safetensors files, read from their headers."""
    found = set()
    for path in folder.glob("*.safetensors"):
        with open(path, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        found |= {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    return found


def _short_run(env: dict, model_folder: Path, text_file: Path, **train: str) -> dict[str, str]:
    return {
        **env, "TRAIN_MODEL": str(model_folder), "TRAIN_DATA": str(text_file), "TRAIN_SEQ_LEN": "32",
        "TRAIN_BATCH_SIZE": "2", "TRAIN_MAX_STEPS": "2", "TRAIN_LOG_STEPS": "1", "TRAIN_SAVE_STEPS": "100",
        **{f"TRAIN_{k.upper()}": v for k, v in train.items()},
    }  # fmt: skip


def test_lora_loads_the_frozen_base_in_the_compute_dtype(run_trainer, trainer_env, model_folder, text_file):
    output = Path(trainer_env["TRAIN_OUTPUT_DIR"])
    result = run_trainer([], env=_short_run(trainer_env, model_folder, text_file, lora="1", precision="bf16"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "weights torch.bfloat16" in result.stderr
    assert _dtypes(output / "final") == {"BF16"}  # the merged model: base weights as loaded
    assert _dtypes(output / "final" / "adapter") == {"F32"}  # the adapters trained in fp32


def test_full_fine_tuning_keeps_fp32_master_weights(run_trainer, trainer_env, model_folder, text_file):
    output = Path(trainer_env["TRAIN_OUTPUT_DIR"])
    result = run_trainer([], env=_short_run(trainer_env, model_folder, text_file, precision="bf16"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "weights torch.float32" in result.stderr
    assert _dtypes(output / "final") == {"F32"}


FSDP = "full_shard" if compat.stack().fsdp2 else "hybrid_shard"  # the strategies this stack runs (trainer.compat)


SHOWN_BY_RUNS = ("shown by real runs' run_config.json: the two FSDP ranks below (a model folder) and "
                 "test_techniques_cpu.py's FSDP in one process (the preset)")  # fmt: skip


@pytest.mark.skipif(compat.stack().fsdp2, reason=SHOWN_BY_RUNS)
def test_fsdp_asks_for_cpu_ram_efficient_loading_of_a_model_folder(config_json, trainer_env, model_folder, text_file):
    folder = config_json(_short_run(trainer_env, model_folder, text_file, fsdp=FSDP))
    assert folder["training_arguments"]["fsdp_config"]["cpu_ram_efficient_loading"] is True
    preset = config_json(_short_run(trainer_env, model_folder, text_file, fsdp=FSDP, model="tiny"))
    assert "cpu_ram_efficient_loading" not in preset["training_arguments"]["fsdp_config"]  # nothing to read


@pytest.mark.skipif(not compat.stack().fsdp2, reason="full_shard (FSDP2) needs transformers 5 and torch >= 2.6")
def test_two_fsdp_ranks_train_a_model_folder(run_trainer, trainer_env, model_folder, text_file):
    output = Path(trainer_env["TRAIN_OUTPUT_DIR"])
    env = _short_run(trainer_env, model_folder, text_file, fsdp="full_shard", nproc_per_node="2")
    result = run_trainer([], env=env, timeout=600, module="trainer.launch")
    assert result.returncode == 0, result.stderr[-4000:]
    config = json.loads((output / "run_config.json").read_text())
    assert config["training_arguments"]["fsdp_config"]["cpu_ram_efficient_loading"] is True
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    assert (output / "final" / "config.json").is_file()


@pytest.mark.parametrize(("native", "expected"), [(False, "float16"), (True, "bfloat16")])
def test_generate_quant_4bit_computes_in_fp16_on_a_gpu_that_only_emulates_bf16(monkeypatch, native, expected):
    """A T4 or V100 computes bf16 only by emulation (slow; torch >= 2.3 counts it unless asked not to): `generate
    --quant 4bit` and `eval --quant 4bit` (one loader) compute in fp16 there, as training would, and in bf16 where
    the GPU has it natively. The GPU is faked at torch's capability probe, which trainer.compat's rule reads."""
    import torch

    from trainer.generate.loading import Choice, Plan, load_how
    from trainer.model.loading import pretrained_kwargs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation or native)
    plan = Plan("model-folder", None, (), "a model folder")
    how = load_how(plan, Choice(quant="4bit"), torch.device("cuda", 0))
    assert pretrained_kwargs(how)["quantization_config"].bnb_4bit_compute_dtype == getattr(torch, expected)
