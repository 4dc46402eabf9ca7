"""A compiled run on the CPU with inductor, as a GPU run compiles (issue 34): plain text reaches attention with no
mask (SDPA's causal kernels), two epochs compile once (the partial last batch is left out and counted), and the
compile time and the time to the first step are in run_config.json. One real run, observed from inside
(tests/trainer/compiled_probe.py); records under compile are kept apart in test_packing.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from train_runs import train_env

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("compiled_probe.py")
BATCH, SEQ_LEN = 4, 64


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("compiled")
    words = ["the", "a", "cat", "dog", "runs", "fast", "slow", "over", "under", "tree", "house"]
    text = " ".join(words[(i * 7) % len(words)] for i in range(300))  # byte-level: 21 sequences of 64 tokens
    (tmp / "plain.txt").write_text(text + "\n")
    out = tmp / "out"
    env = train_env(out, data=tmp / "plain.txt", seq_len=SEQ_LEN, batch_size=BATCH, max_steps=-1, epochs=2,
                    compile=1, deterministic=0)  # fmt: skip
    proc = subprocess.run([sys.executable, str(PROBE)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    config = json.loads((out / "run_config.json").read_text())
    return {"probe": probe, "config": config, "log": proc.stderr}


def test_plain_text_reaches_attention_with_no_mask(compiled_run: dict[str, Any]) -> None:
    """Traced in the compiled layer (and at every eager call): attention_mask None, so SDPA runs is_causal=True."""
    masks = compiled_run["probe"]["masks"]
    assert masks.get("none", 0) >= 1 and "mask" not in masks, masks


def test_two_epochs_compile_once(compiled_run: dict[str, Any]) -> None:
    probe, config = compiled_run["probe"], compiled_run["config"]
    assert probe["exit"] == 0
    assert probe["stats"]["unique_graphs"] == 1 and probe["frames"]["total"] == 1, probe  # no recompile
    assert probe["breaks"] == 0
    data = config["training_data"]
    left = data["sequences"] % BATCH
    assert left > 0  # a partial last batch, which would recompile
    assert data == {"sequences": data["sequences"], "global_batch": BATCH, "left_out_per_epoch": left,
                    "left_out_tokens_per_epoch": left * SEQ_LEN}  # fmt: skip
    said = f"each epoch leaves out {left} of {data['sequences']} sequences ({left * SEQ_LEN} tokens)"
    assert said in compiled_run["log"]
    assert config["training_arguments"]["dataloader_drop_last"] is True
    assert "4 LlamaDecoderLayer layers compiled in place" in compiled_run["log"]


def test_compile_time_and_first_step_are_recorded(compiled_run: dict[str, Any]) -> None:
    config = compiled_run["config"]
    startup = config["startup"]
    assert startup["compile_s"] > 0 and startup["to_first_step_s"] >= startup["compile_s"]
    reason = config["decisions"]["compile"]["reason"]
    assert "regional" in reason and "TORCHINDUCTOR_CACHE_DIR=" in reason
    env = config["environment"]
    # from source beside HF_HOME (here ~/.cache/huggingface's), not torch's /tmp default that importing Transformers'
    # TrainingArguments writes into the environment before the run picks its caches
    caches = Path.home() / ".cache" / "torch-compile"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(caches / "inductor"), env
    assert env["TRITON_CACHE_DIR"] == str(caches / "triton"), env


def test_a_compiled_run_evaluates_every_sequence(tmp_path: Path) -> None:
    """drop_last holds for training only: the Trainer of a compiled run (dataloader_drop_last, as its
    TrainingArguments say) still evaluates the partial last batch."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from trainer.run.checkpoint import AtomicCheckpointTrainer

    items = [{"input_ids": torch.arange(8), "labels": torch.arange(8)} for _ in range(5)]
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))  # fmt: skip
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=2, per_device_eval_batch_size=2,
                             dataloader_drop_last=True, use_cpu=True, report_to=[])  # fmt: skip
    trainer = AtomicCheckpointTrainer(model=model, args=args, train_dataset=items, eval_dataset=items)
    assert len(trainer.get_train_dataloader()) == 2  # the fifth sequence is left out of training (counted)
    assert sum(len(b["input_ids"]) for b in trainer.get_eval_dataloader()) == 5
    assert trainer.args.dataloader_drop_last is True
