"""Online RL across a resume (trainer/run/online_resume.py): what TRL's GRPO/RLOO trainers keep outside the checkpoint
is kept. Each epoch's prompt order: TRL's own sampler, told the epoch as Transformers' Trainer tells it, gives a resumed
epoch the uninterrupted run's order (a real resume at an epoch boundary: test_vllm_engine.py's, in the CPU RL venv).
A generation that serves two optimizer steps (`--steps_per_generation 2`): a run resumed from a checkpoint between
them gives the uninterrupted run's per-step rewards, samples and final weights (real runs of the tiny preset).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from test_online_rl import (
    files_fixture,  # noqa: F401 (the fixture `files`: prompts and a reward file)
    grpo_env,
)
from train_runs import assert_same_weights, finish, start


def test_a_resumed_epoch_gets_the_uninterrupted_runs_prompt_order() -> None:
    """TRL's own sampler (GRPOTrainer._get_train_sampler: RepeatSampler, seeded once, one permutation per epoch) under
    trainer.run.online_resume: an uninterrupted sequence of epochs keeps TRL's order, and a new sampler (a resumed
    process) told `set_epoch(2)`, as Transformers' Trainer tells it, gives epoch 2's order, not epoch 0's (TRL's
    alone would; a resume from checkpoint-8 of test_vllm_engine.py's run trains its second epoch, it failed so)."""
    from types import SimpleNamespace

    from trl import GRPOTrainer

    from trainer.run.online_resume import resumable_online

    class Base:  # the attributes GRPOTrainer._get_train_sampler reads; the method itself is TRL's
        _get_train_sampler = GRPOTrainer._get_train_sampler
        train_dataset = tuple(range(32))
        num_generations, num_iterations, shuffle_dataset = 4, 1, True
        args = SimpleNamespace(generation_batch_size=16, steps_per_generation=1, seed=7)

    def epochs(sampler: object, count: int) -> list[list[int]]:
        return [list(sampler) for _ in range(count)]  # type: ignore[call-overload]

    trl_order = epochs(Base()._get_train_sampler(), 3)
    assert trl_order[0] != trl_order[2]
    resumable = resumable_online(Base)
    uninterrupted = resumable()._get_train_sampler()
    seen = []
    for epoch in range(3):
        uninterrupted.set_epoch(epoch)
        seen.append(list(uninterrupted))
    assert seen == trl_order
    resumed = resumable()._get_train_sampler()
    resumed.set_epoch(2)
    assert list(resumed) == trl_order[2]
    resumed.set_epoch(1)  # back: the order of epoch 1 again
    assert list(resumed) == trl_order[1]


def logged_rewards(out: Path) -> list[float | None]:
    """Each logged step's reward (None on a step that used the generation before it: TRL logs none)."""
    return [json.loads(line).get("reward") for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_run_resumed_inside_a_generation_block_continues_it(files: tuple[Path, Path], tmp_path: Path) -> None:
    """`--steps_per_generation 2`: steps 1, 3, 5 generate and steps 2, 4, 6 train on the rest of that generation.
    checkpoint-3 falls between step 3 and 4: it keeps the rest (GENERATION_BUFFER), and the run resumed from it gives
    the uninterrupted run's rewards, samples.jsonl and final weights. Without it (tried) the resumed run generated
    again at step 4 and on every even step after, so its later steps trained on other completions."""
    from trainer.run.online_resume import GENERATION_BUFFER

    def env(out: Path) -> dict[str, str]:
        return grpo_env(out, files, "lowercase_share", max_steps=6, save_steps=3, args="--steps_per_generation 2")

    whole = tmp_path / "whole"
    code, err = finish(start(env(whole)))
    assert code == 0, err[-3000:]
    assert (whole / "checkpoint-3" / GENERATION_BUFFER).is_file() and not (whole / "checkpoint-6" / GENERATION_BUFFER
                                                                          ).exists()  # fmt: skip
    rewards = logged_rewards(whole)
    assert [r is None for r in rewards] == [False, True] * 3, rewards
    out = tmp_path / "out"
    shutil.copytree(whole, out, ignore=shutil.ignore_patterns("final", "checkpoint-6"))
    code, err = finish(start(env(out)))
    assert code == 0 and f"continuing from {out / 'checkpoint-3'}" in err, err[-3000:]
    assert logged_rewards(out) == rewards
    assert (out / "samples.jsonl").read_text() == (whole / "samples.jsonl").read_text()
    assert_same_weights(out / "final", whole / "final")
