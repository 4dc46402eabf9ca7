"""Evaluation: TRAIN_EVAL_SPLIT / TRAIN_EVAL_DATA with TRAIN_EVAL_STEPS put eval loss and perplexity in metrics.jsonl
and TensorBoard; TRAIN_KEEP_BEST keeps the best checkpoint out of rotation. Real `python -m trainer train` runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from hub_support import run_env
from train_runs import assert_same_weights


def _eval_lines(out: Path) -> list[dict]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [x for x in lines if "eval_loss" in x]


@pytest.fixture(scope="module")
def split_run(run_trainer, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A run holding out TRAIN_EVAL_SPLIT=0.1 with TRAIN_KEEP_BEST, 4 steps saved every 2 (evaluated at each save),
    as it was before anything resumed it: its folder, environment, result, evaluation lines and TensorBoard events.
    test_keep_best_survives_a_resume resumes it; test_eval_split_... reads what its first run wrote."""
    tmp = tmp_path_factory.mktemp("split")
    env = run_env(tmp, eval_split=0.1, keep_best=1, max_steps=4, save_steps=2, save_total_limit=1, lr=0.01)
    result = run_trainer(["train"], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp / "output"
    events = b"".join(p.read_bytes() for p in (out / "runs").rglob("events.out.tfevents*"))
    return SimpleNamespace(out=out, env=env, result=result, evals=_eval_lines(out), events=events)


def test_eval_split_writes_eval_loss_and_perplexity(split_run: SimpleNamespace) -> None:
    assert [e["step"] for e in split_run.evals] == [2, 4]
    for e in split_run.evals:
        assert e["eval_loss"] > 0 and e["eval_perplexity"] == pytest.approx(math.exp(e["eval_loss"]))
    assert "held out (TRAIN_EVAL_SPLIT=0.1)" in split_run.result.stderr
    assert b"eval/loss" in split_run.events and b"eval/perplexity" in split_run.events


def test_eval_data_with_keep_best_keeps_the_best_checkpoint(run_trainer, tmp_path: Path, text_file: Path) -> None:
    held = tmp_path / "eval.jsonl"
    held.write_text("".join(json.dumps({"text": f"held-out sentence {i} about foxes."}) + "\n" for i in range(60)))
    env = run_env(tmp_path, data=text_file, eval_data=held, keep_best=1, max_steps=8, save_steps=2,
                  save_total_limit=2, lr=0.01)  # fmt: skip
    result = run_trainer(["train"], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "output"
    evals = _eval_lines(out)
    assert [e["step"] for e in evals] == [2, 4, 6, 8]
    best = min(evals, key=lambda e: e["eval_loss"])
    best_dir = out / f"checkpoint-{best['step']}"
    state = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] == str(best_dir)
    assert state["best_metric"] == pytest.approx(best["eval_loss"])
    kept = {p.name for p in out.glob("checkpoint-*")}
    assert best_dir.name in kept and "checkpoint-8" in kept and len(kept) == 2, kept
    assert (best_dir / "trainkit_complete").is_file()
    assert_same_weights(out / "final", best_dir)  # final/ is the best model


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"eval_steps": 5}, "TRAIN_EVAL_STEPS=5 needs evaluation data"),
        ({"keep_best": 1}, "TRAIN_KEEP_BEST=1 needs evaluation data"),
        ({"eval_split": 0.1, "eval_data": "/nonexistent/eval.txt"}, "both choose evaluation data"),
        ({"eval_split": 0.1, "keep_best": 1, "save_steps": 10, "eval_steps": 3}, "must be a multiple"),
        ({"eval_data": "/nonexistent/eval.txt"}, "TRAIN_EVAL_DATA=/nonexistent/eval.txt: no such file"),
        ({"eval_split": 0.7}, "TRAIN_EVAL_SPLIT='0.7': input should be less than 0.5"),
        ({"eval_split": 1e-9}, "leave 0 for evaluation; use a larger fraction"),
    ],
)
def test_eval_mistakes_exit_2(run_trainer, tmp_path: Path, train: dict, message: str) -> None:
    result = run_trainer(["train"], env=run_env(tmp_path, **train))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_keep_best_survives_a_resume(run_trainer, split_run: SimpleNamespace) -> None:
    """The best checkpoint is named by its published folder (never the staging one), so a resumed run still finds
    it, keeps it out of rotation and makes it final/."""
    out = split_run.out
    best_before = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["best_model_checkpoint"]
    assert Path(best_before).parent == out and Path(best_before).is_dir()
    resumed = run_trainer(["train"], env={**split_run.env, "TRAIN_MAX_STEPS": "8"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "continuing from" in resumed.stderr and "recorded in the resumed state does not" not in resumed.stderr
    evals = _eval_lines(out)
    assert [e["step"] for e in evals] == [2, 4, 6, 8]
    best = out / f"checkpoint-{min(evals, key=lambda e: e['eval_loss'])['step']}"
    assert best.is_dir()
    assert_same_weights(out / "final", best)


def test_a_malformed_line_in_eval_data_names_train_eval_data(run_trainer, tmp_path: Path, text_file: Path) -> None:
    held = tmp_path / "eval.jsonl"
    good = [json.dumps({"text": f"held-out sentence {i} about foxes."}) + "\n" for i in range(10)]
    held.write_text("".join(good) + "{not json\n")  # past the first record: found while the data is read
    result = run_trainer(["train"], env=run_env(tmp_path, data=text_file, eval_data=held, max_steps=2, eval_steps=2))
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"TRAIN_EVAL_DATA: {held}:11: not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr
