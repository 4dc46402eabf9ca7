"""Online RL's built-in rewards on real strings (trainer.run.rewards: `math` through math-verify, `exact`), the
stacks that refuse `math` (named with the row, before torch), and `exact` learned in training: the tiny preset is
fine-tuned toward a prompts file's answers (SFT, one run shared), then GRPO from that folder with TRAIN_REWARD=exact,
in full and with LoRA, raises the share of exact answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from train_runs import finish, start, train_env

from trainer import compat
from trainer.config.online import reward_stack_problems
from trainer.config.parse import parse_settings
from trainer.run.rewards import exact, math


def test_math_checks_the_answer_as_mathematics() -> None:
    completions = ["\\boxed{1/2}", "so x = 0.5", "The answer is $\\frac{1}{2}$.", "0.25", "no idea", "\\boxed{2/4}"]
    assert math([None] * 6, completions, ["0.5"] * 6) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    chat = [[{"role": "assistant", "content": "x = \\boxed{\\frac{\\sqrt{2}}{2}}"}], "$(x+1)^2$", "3"]
    assert math([None] * 3, chat, ["\\frac{1}{\\sqrt{2}}", "x^2+2x+1", "4"]) == [1.0, 1.0, 0.0]
    for answer in ("?", ""):
        with pytest.raises(ValueError, match=re.escape(f"the answer {answer!r} holds no mathematics")):
            math([None], ["1"], [answer])
    assert exact([None] * 3, [" Paris ", "paris.", "PARIS"], ["paris"] * 3) == [1.0, 0.0, 1.0]


def test_math_is_refused_where_math_verify_is_not_installed() -> None:
    """Here (the default row) math runs; a stack without math-verify (the Python 3.10 rows, where TRL is not
    either) refuses it naming the row. The real 12.1 stack's refusal: tests/trainer/test_rows.py."""
    settings = parse_settings({"TRAIN_METHOD": "grpo", "TRAIN_REWARD": "exact,math:0.5"})
    assert reward_stack_problems(settings) == []
    without = compat.Stack(torch=(2, 1, 2), transformers=(4, 46, 3), flash_attn=None, trl=None, math_verify=None)
    problem = compat.switch_problem("TRAIN_REWARD=math", without)
    assert problem is not None and problem.startswith(
        "TRAIN_REWARD=math is not supported on this stack (torch 2.1.2, transformers 4.46.3): math-verify"
    ), problem
    assert compat.switch_problem("TRAIN_REWARD=math") is None


WORDS = ("cat", "sun", "red", "sky", "owl", "map", "ink", "oak")
RISE = 0.06  # half the smallest rise of the exact share measured on AVX-512 and AVX2 (the test's docstring)


@pytest.fixture(scope="module", name="tuned")  # also test_vllm_engine.py's starting point (imported there)
def tuned_fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the tiny preset fine-tuned (SFT, 80 steps) on each prompt answered two ways, the right word and " no", so it
    says either about as often; a folder of prompts files with the right word as `answer`: prompts.jsonl, all 8
    words, and first.jsonl, second.jsonl, 4 words each)."""
    folder = tmp_path_factory.mktemp("tuned")
    sft = folder / "sft.jsonl"
    sft.write_text("".join(json.dumps({"prompt": f"say {w}:", "completion": c}) + "\n" for w in WORDS
                           for c in (f" {w}", " no")))  # fmt: skip
    code, err = finish(start(train_env(folder / "sft", data=sft, max_steps=80, batch_size=8, lr=3e-3)), 900)
    assert code == 0, err[-3000:]
    for name, words in (("prompts", WORDS), ("first", WORDS[:4]), ("second", WORDS[4:])):
        rows = [{"prompt": f"say {w}:", "answer": w} for w in words * (32 // len(words))]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / "sft" / "final", folder


@pytest.mark.parametrize(("lora", "lr"), [(0, 1e-4), (1, 1e-3)], ids=["full", "lora"])
def test_exact_rises_after_sft_toward_the_answers(tuned: tuple[Path, Path], lora: int, lr: float, tmp_path: Path
                                                   ) -> None:  # fmt: skip
    """GRPO from the fine-tuned folder with TRAIN_REWARD=exact, 16 steps, in full (a small learning rate: the
    policy is a trained model) and with LoRA (its prompts a mix of two files): the share of exact answers rises
    from the first 4 steps' (the fine-tuned model's own, about 0.7) to the last 4 steps'.

    The property, not one trajectory's numbers: the trajectory differs by CPU instruction path (issue 59: on AVX2
    the full run ended at 0.891, short of the 0.9 once asserted). Measured (first 4 -> last 4 steps): AVX-512 full
    0.719 -> 0.953, LoRA 0.703 -> 0.922; AVX2 (forced: MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
    ATEN_CPU_CAPABILITY=avx2) full 0.703 -> 0.891, LoRA 0.703 -> 0.828. The rise asserted, RISE, is half the
    smallest measured (0.125)."""
    out = tmp_path / "grpo"
    trackers = "tensorboard,wandb,mlflow" if lora else "tensorboard"  # W&B offline, MLflow's file store: no server
    # the LoRA run's prompts: a mix of two files by weight (each file used once per epoch, in a seeded order)
    data = f"{tuned[1] / 'first.jsonl'}:1,{tuned[1] / 'second.jsonl'}:1" if lora else tuned[1] / "prompts.jsonl"
    env = train_env(out, method="grpo", model=tuned[0], data=data, reward="exact", batch_size=16,
                    rl_generations=4, rl_max_new_tokens=8, lr=lr, max_steps=16, lora=lora,
                    report_to=trackers)  # fmt: skip
    code, err = finish(start(env), 900)
    assert code == 0, err[-3000:]
    if lora:
        assert "data mix: first (" in err and "achieved 50.00% of 64 prompts; 32 records drawn from its 32" in err
    rewards = [json.loads(line)["rewards/exact/mean"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    print(f"exact per step ({'LoRA' if lora else 'full'}): {[round(r, 3) for r in rewards]}; first 4 steps "
          f"{first:.3f}, last 4 steps {last:.3f}")  # fmt: skip
    assert len(rewards) == 16 and last >= first + RISE, rewards
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    right = [s for s in samples if s["rewards"]["exact"] == 1.0]
    assert right and all(s["completion"].strip() == s["prompt"][4:-1] for s in right)
    if lora:  # the same rows as a W&B table and an MLflow artifact per step
        tables = sorted((out / "wandb").rglob("completions_*.table.json"))
        assert len(tables) == 16, tables
        table = json.loads(tables[0].read_text())
        assert table["columns"] == ["step", "prompt", "completion", "exact", "reward"], table
        artifacts = sorted(p.name for p in (out / "mlruns").rglob("samples/step-*.jsonl"))
        assert artifacts == [f"step-{step:07d}.jsonl" for step in range(1, 17)], artifacts


def test_a_reward_model_folder_is_loaded_by_trainkit_as_trl_would_load_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TRAIN_REWARD=FOLDER: trainer.model's one loader makes the reward model (its log line names the folder and the
    one-score head) and TRL is handed the model: the same class, dtype and scores as TRL's own load from the path,
    and the name TRL logs its reward under (rewards/FOLDER/mean)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from trainer.config.online import rewards
    from trainer.model.loading import LoadHow, Weights, load
    from trainer.run.rewards import build_rewards
    from trainer.tokenizer import byte_level_tokenizer

    folder = tmp_path / "scorer"
    tokenizer = byte_level_tokenizer()
    torch.manual_seed(0)
    load(Weights(preset="tiny", tokenizer=tokenizer), LoadHow(score_head=True)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with caplog.at_level("INFO", logger="trainer"):
        [model] = build_rewards(rewards(str(folder)), frozenset(), 16)
    assert f"model loaded: {folder}: " in caplog.text and "(one-score head)" in caplog.text
    trl_own = AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=1)  # TRL 1.16's load
    assert type(model) is type(trl_own) and model.dtype == trl_own.dtype and model.config.num_labels == 1
    ids = torch.tensor([tokenizer("the sun is red")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model.eval()(input_ids=ids).logits, trl_own.eval()(input_ids=ids).logits)
    assert model.config._name_or_path.split("/")[-1] == rewards(str(folder)).specs[0].name == "scorer"
