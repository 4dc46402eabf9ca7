"""RoPE scaling (TRAIN_ROPE_SCALING, issue #39): a real tiny run past the preset's 2048 positions, and the settings
that exit 2 before torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_scaled_run_saves_and_loads_the_scaling(
    run_trainer, trainer_env: dict[str, str], text_file: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.model.build import preset_config
    from trainer.tokenizer import byte_level_tokenizer

    env = {**trainer_env, "TRAIN_DATA": str(text_file), "TRAIN_ROPE_SCALING": "linear", "TRAIN_SEQ_LEN": "4096",
           "TRAIN_BATCH_SIZE": "1", "TRAIN_MAX_STEPS": "1", "TRAIN_SAVE_STEPS": "1"}  # fmt: skip
    result = run_trainer([], env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "RoPE scaling: linear, factor 2 over 2048 positions" in result.stderr

    final = Path(trainer_env["TRAIN_OUTPUT_DIR"]) / "final"
    saved = json.loads((final / "config.json").read_text())
    scaling = saved.get("rope_parameters") or saved["rope_scaling"]  # transformers 5 / 4
    assert (scaling["rope_type"], scaling["factor"]) == ("linear", 2.0)  # derived: 4096 / 2048

    model = AutoModelForCausalLM.from_pretrained(final)
    rotary = model.model.rotary_emb
    dim = model.config.hidden_size // model.config.num_attention_heads
    unscaled = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    assert rotary.rope_type == "linear" and torch.allclose(rotary.inv_freq, unscaled / 2)
    with torch.no_grad():
        logits = model(torch.zeros(1, 4096, dtype=torch.long)).logits
    assert logits.shape[1] == 4096 and torch.isfinite(logits).all()

    # an adapter-only final/ (QLoRA, DeepSpeed, FSDP) is exported onto the unscaled base, scaled again as trained
    tokenizer = byte_level_tokenizer()
    base = tmp_path / "base"
    AutoModelForCausalLM.from_config(preset_config("tiny", len(tokenizer), 64, tokenizer)).save_pretrained(base)
    assert _scaling_of_base_exported_with(final.parent, base) == "linear"

    # final/ as the next run's model: its scaling counts, and is not applied twice
    again = {**trainer_env, "TRAIN_MODEL": str(final), "TRAIN_SEQ_LEN": "8192"}
    result = run_trainer(["config"], env=again, timeout=120)
    assert result.returncode == 2 and "is above the 4096 positions" in result.stderr, result.stderr[-3000:]
    result = run_trainer(["config"], env={**again, "TRAIN_ROPE_SCALING": "yarn"}, timeout=120)
    assert result.returncode == 2 and "already carries RoPE scaling (linear)" in result.stderr, result.stderr[-3000:]


def _no_rope_model(root: Path) -> Path:
    folder = root / "gpt2-like"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 1024}))
    return folder


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TRAIN_SEQ_LEN": "4096"}, "TRAIN_SEQ_LEN=4096 is above TRAIN_MODEL=tiny's max_position_embeddings (2048): "
                                    "set TRAIN_ROPE_SCALING"),
        ({"TRAIN_ROPE_SCALING": "longrope"}, "TRAIN_ROPE_SCALING='longrope' is not allowed; allowed values: none, "
                                             "linear, dynamic, yarn, llama3"),
        ({"TRAIN_ROPE_SCALING": "yarn", "TRAIN_ROPE_FACTOR": "-2"}, "TRAIN_ROPE_FACTOR=-2: the factor must be above 1"),
        ({"TRAIN_ROPE_SCALING": "linear", "TRAIN_ROPE_FACTOR": "2", "TRAIN_MODEL": _no_rope_model},
         "gpt2 has no rotary position embeddings to scale; unset TRAIN_ROPE_SCALING"),
        ({"TRAIN_ROPE_SCALING": "yarn", "TRAIN_ROPE_FACTOR": "nan"}, "TRAIN_ROPE_FACTOR='nan': input should be a "
                                                                      "finite number"),
        ({"TRAIN_ROPE_SCALING": "linear", "TRAIN_ROPE_FACTOR": "inf"}, "TRAIN_ROPE_FACTOR='inf': input should be a "
                                                                        "finite number"),
        ({"TRAIN_LR": "inf"}, "TRAIN_LR='inf': input should be a finite number"),
    ],
    ids=["longer-than-the-model", "unsupported-type", "negative-factor", "model-without-rope", "nan-factor",
         "inf-factor", "inf-lr"],
)  # fmt: skip
def test_bad_rope_settings_exit_2_before_torch(
    run_trainer, imported_modules, trainer_env: dict[str, str], tmp_path: Path, env: dict, expected: str
) -> None:
    env = {k: v(tmp_path) if callable(v) else v for k, v in env.items()}
    result = run_trainer(["config"], env={**trainer_env, **env}, python_args=["-X", "importtime"], timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert expected in result.stderr
    assert "torch" not in imported_modules(result.stderr)


def _scaling_of_base_exported_with(run_dir: Path, base: Path) -> str:
    """The RoPE type of an unscaled base as export loads it to merge an adapter of the run in `run_dir`."""
    from trainer.config import run_record
    from trainer.export.merge import load_base

    return load_base(str(base), "float32", run_record.read(run_dir)).model.rotary_emb.rope_type
