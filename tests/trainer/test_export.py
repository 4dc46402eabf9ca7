"""`python -m trainer export`: real runs in, plain Transformers folders out, checked against the source computed
independently here (base + adapter through PEFT; the weights DeepSpeed gathered into the ZeRO-3 checkpoint).

FSDP consolidation needs a sharded FSDP checkpoint, which accelerate writes only for GPU worlds (on CPUs it trains
DDP copies: trainer/config/sharding.py); it is exercised in tests/gpu/test_export_fsdp_gpu.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, base_env
from helpers import assert_user_error_in_process
from hub_support import run_env
from waiting import wait_for

PLAIN_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "README.md"}  # fmt: skip


def _logits(model, ids):
    import torch

    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def merged_export(tmp_path_factory: pytest.TempPathFactory, run_trainer, lora_run) -> tuple[Path, str]:
    """The LoRA checkpoint exported (merged into its base) once for the tests that read it: the folder, export's log."""
    out = tmp_path_factory.mktemp("merged") / "merged"
    result = run_trainer(["export", str(lora_run / "output" / "checkpoint-2"), str(out)], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result.stderr


def test_lora_checkpoint_exports_to_a_plain_folder_equal_to_base_plus_adapter(lora_run, merged_export) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    checkpoint = lora_run / "output" / "checkpoint-2"
    assert (checkpoint / "adapter_config.json").is_file() and not (checkpoint / "config.json").exists()
    out = merged_export[0]
    names = {p.name for p in out.iterdir()}
    assert names >= PLAIN_FILES and not any(n.startswith("adapter") for n in names)  # loads without peft
    ids = torch.arange(40).unsqueeze(0)
    exported = _logits(AutoModelForCausalLM.from_pretrained(out), ids)
    base = AutoModelForCausalLM.from_pretrained(lora_run / "base")
    base_logits = _logits(base, ids)
    reference = _logits(PeftModel.from_pretrained(base, checkpoint), ids)
    assert torch.allclose(exported, reference, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(exported, base_logits, atol=1e-3)  # the adapter changed something
    card = (out / "README.md").read_text()
    assert "LoRA adapter merged into the base" in card and "last loss" in card and "(step 2)" in card
    assert "TRAIN_LORA" in card


def _loaded(stderr: str) -> str:
    """trainer.model's one line naming what it loaded (weights, head, dtype, adapter), its time stripped."""
    (line,) = [line for line in stderr.splitlines() if " INFO model loaded: " in line]
    return line.split(" INFO model loaded: ", 1)[1]


def test_one_loader_serves_a_lora_run_to_generate_eval_and_export(run_trainer, lora_run, merged_export,
                                                                  tmp_path) -> None:  # fmt: skip
    """trainer.model loads the LoRA checkpoint (base + adapter) the same way for generate, eval and export: the same
    base, dtype, adapter and head; and final/ (merged by the run), the checkpoint and its merged export give the
    same greedy answers and the same eval loss."""
    out = lora_run / "output"
    texts = ["The quick brown fox", "Once upon a time there", "Hello"]
    prompts, data = tmp_path / "prompts.jsonl", tmp_path / "eval.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    data.write_text("".join(json.dumps({"prompt": t, "completion": " jumps over the dog."}) + "\n" for t in texts))
    merged, export_log = merged_export
    loaded, answers, losses = {}, {}, {}
    for name, model in {"checkpoint": out / "checkpoint-2", "final": out / "final", "export": merged}.items():
        answered = tmp_path / f"{name}.jsonl"
        result = run_trainer(["generate", str(model), "--input", str(prompts), "--output", str(answered),
                              "--max-new-tokens", "8"], timeout=600)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        loaded[name] = _loaded(result.stderr)
        answers[name] = [json.loads(line)["response"] for line in answered.read_text().splitlines()]
        if name != "export":
            result = run_trainer(["eval", str(model), "--data", str(data), "--output", str(tmp_path / f"eval-{name}")],
                                 timeout=600)  # fmt: skip
            assert result.returncode == 0, result.stderr[-3000:]
            assert _loaded(result.stderr) == loaded[name]  # eval loads as generate does
            losses[name] = json.loads((tmp_path / f"eval-{name}" / "eval_results.json").read_text())["loss"]
    assert _loaded(export_log) == loaded["checkpoint"]  # export merges what generate and eval run
    assert f"{lora_run / 'base'} + LoRA adapter {out / 'checkpoint-2'}: LlamaForCausalLM (LM head)" in loaded[
        "checkpoint"]  # fmt: skip
    assert loaded["final"].startswith(f"{out / 'final'}: LlamaForCausalLM (LM head)")
    assert answers["final"] == answers["export"] == answers["checkpoint"]
    assert losses["final"] == pytest.approx(losses["checkpoint"], rel=1e-4)


def test_export_refuses_an_occupied_out_and_keeps_the_adapter_on_request(run_trainer, lora_run, tmp_path,
                                                                         capsys) -> None:  # fmt: skip
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "mine.txt").write_text("keep me")
    run = lora_run / "output"
    refused = run_trainer(["export", str(run), str(occupied)], timeout=300)
    assert refused.returncode == 2 and "not empty" in refused.stderr and "Traceback" not in refused.stderr
    assert (occupied / "mine.txt").read_text() == "keep me"
    kept = run_trainer(["export", str(run / "checkpoint-2"), str(tmp_path / "adapter"), "--adapter-only"], timeout=300)
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= {
        p.name for p in (tmp_path / "adapter").iterdir()
    }
    assert_user_error_in_process(["export", str(tmp_path / "nothing"), str(tmp_path / "x")], capsys, "no such folder")


def test_adapter_only_refuses_an_adapter_vllm_refuses_naming_the_merge(run_trainer, lora_run, tmp_path) -> None:
    """A PEFT adapter with modules_to_save (here the LM head, trained whole beside the LoRA matrices): vLLM's LoRA
    loader refuses it, so `export --adapter-only` does, before publishing, naming it and the way out (merge)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(lora_run / "base")
    config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"], task_type="CAUSAL_LM")
    get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    result = run_trainer(["export", str(tmp_path / "adapter"), str(tmp_path / "out"), "--adapter-only"], timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert ("vLLM cannot serve the adapter of" in result.stderr and "modules_to_save ['lm_head']"
            in result.stderr and "Export without --adapter-only: the adapter merged into its base" in result.stderr)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-export-*"))


def test_sigterm_mid_export_publishes_nothing_and_a_second_export_into_out_exits_2(run_trainer, lora_run,
                                                                                   tmp_path) -> None:  # fmt: skip
    """An export stopped (SIGSTOP) while its staging folder exists: a second export into the same OUT exits 2 naming
    it and touches nothing; SIGTERM then ends the first with exit 143, no OUT and no staging folder left; OUT is
    free again afterwards."""
    out, staging, err = tmp_path / "merged", tmp_path / ".tmp-export-merged", tmp_path / "first.err"
    argv = ["export", str(lora_run / "output" / "checkpoint-2"), str(out)]
    with err.open("w") as sink:
        first = subprocess.Popen([PYTHON, "-m", "trainer", *argv], cwd=REPO, env=base_env(), stdout=subprocess.DEVNULL,
                                 stderr=sink, text=True, start_new_session=True)  # fmt: skip
    wait_for(staging.is_dir, 300, "the staging folder", interval=0.005, proc=first)
    os.killpg(first.pid, signal.SIGSTOP)  # held mid-export, whatever the machine's load
    try:
        second = run_trainer(argv, timeout=300)
        held = staging.is_dir() and not out.exists()
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        os.killpg(first.pid, signal.SIGCONT)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert f"export OUT={out}: another export is writing it (pid {first.pid} on host" in second.stderr
    assert "give this one another OUT" in second.stderr and "--output" not in second.stderr  # export takes no --output
    assert held  # the second touched neither
    assert first.wait(timeout=120) == 143, err.read_text()[-3000:]
    assert f"export interrupted: {out} was not written" in err.read_text() and "Traceback" not in err.read_text()
    assert not out.exists() and not staging.exists() and not (tmp_path / ".merged.lock").exists()


def test_zero3_checkpoint_exports_to_loadable_safetensors(run_trainer, run_python, tmp_path) -> None:
    """A real ZeRO-3 world of one on CPU (gloo); HOME is the machine's, so DeepSpeed's JIT-built communication op is
    compiled once per machine (as in test_zero3_sizes.py)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    env = run_env(tmp_path, zero_stage=3, max_steps=2, save_steps=2)
    env.pop("HOME")
    result = run_trainer([], env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = tmp_path / "output" / "checkpoint-2"
    assert any((checkpoint / "global_step2").glob("*model_states.pt"))
    out = tmp_path / "exported"
    exported = run_trainer(["export", str(checkpoint), str(out)], timeout=600)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "zero_to_fp32" in exported.stderr
    model = AutoModelForCausalLM.from_pretrained(out)
    weights = load_file(out / "model.safetensors")
    gathered = load_file(checkpoint / "model.safetensors")  # what DeepSpeed gathered at save time
    shared = sorted(set(weights) & set(gathered))
    assert len(shared) >= len(gathered) - 1  # the tied lm_head may be stored once
    assert all(torch.equal(weights[k], gathered[k]) for k in shared)
    assert model.num_parameters() > 0 and json.loads((out / "config.json").read_text())["model_type"] == "llama"
