"""A diverged run (TRAIN_LR=3e4, a typo for 3e-4) never passes for a finished one (trainer.run.divergence).

One real run through the image's launcher and torchrun (two ranks, gloo on the CPU, the default restarts): it
diverges within a few steps; the launcher exits EXIT_DIVERGED (torchrun itself exits 1, and would restart the
workers), no final/, no checkpoint after the divergence, the kept checkpoint finite, metrics.jsonl strict JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_runs import finish, start, train_env

from trainer.errors import EXIT_DIVERGED
from trainer.run.divergence import RECORD


def _strict(line: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"not strict JSON: {name} in {line}")

    return json.loads(line, parse_constant=refuse)


def test_a_diverged_run_exits_4_without_final_or_nonfinite_checkpoints(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = train_env(out, lr="3e4", max_steps=12, save_steps=2, nproc_per_node=2)
    code, err = finish(start(env, ["-m", "trainer.launch", "train"]), timeout=400)
    assert code == EXIT_DIVERGED, err[-4000:]
    assert "Traceback" not in "".join(line for line in err.splitlines(True) if line.startswith("[rank"))
    assert f"a trainer process found the run diverged (exit {EXIT_DIVERGED}); torchrun exited 1" in err
    record = json.loads((out / RECORD).read_text())
    step = record["step"]
    assert f"training diverged at step {step}: non-finite gradient norm" in err
    assert "with these same settings, and would again" in err  # torchrun's restarts (TRAIN_MAX_RESTARTS=3) end at once
    assert f"exit {EXIT_DIVERGED}" in err and "TRAIN_LR (now 30000)" in err
    assert not (out / "final").exists() and not list(out.glob(".tmp-*"))
    kept = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert kept and all(int(p.name.split("-")[1]) < step for p in kept), (step, kept)
    for name, tensor in load_file(kept[-1] / "model.safetensors").items():
        assert torch.isfinite(tensor).all(), name
    lines = [_strict(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(r["loss"] is None or math.isfinite(r["loss"]) for r in lines)
    assert all(r["loss"] != 0.0 for r in lines)  # a NaN is never logged as 0.0
    assert any(r["grad_norm"] is None for r in lines if r["step"] >= step)  # the NaN norm, as null


def test_export_and_push_refuse_a_damaged_or_nonfinite_model_naming_it(run_trainer, tmp_path: Path) -> None:
    """A truncated model.safetensors (a copy cut short): export exits 2 naming the file. NaN in one tensor (what a
    diverged run leaves): push exits 2 naming the tensor, before any token or network question."""
    from hub_support import save_tiny_model
    from safetensors.torch import save_file

    damaged, diverged = tmp_path / "damaged", tmp_path / "diverged"
    save_tiny_model(damaged)
    save_tiny_model(diverged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    tensors = load_file(diverged / "model.safetensors")
    name = sorted(tensors)[3]
    tensors[name][0] = float("nan")
    save_file(tensors, diverged / "model.safetensors", metadata={"format": "pt"})

    export = run_trainer(["export", str(damaged), str(tmp_path / "out")], timeout=300)
    assert export.returncode == 2, export.stderr[-3000:]
    assert f"{weights} is damaged" in export.stderr and "Traceback" not in export.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))
    push = run_trainer(["push", str(diverged), "org/name"], env={"HF_TOKEN": "hf_" + "x" * 30}, timeout=300)
    assert push.returncode == 2, push.stderr[-3000:]
    assert f"holds non-finite weights (NaN or Inf), first in tensor {name!r}" in push.stderr
    assert "Traceback" not in push.stderr


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_the_guard_cancels_the_save_or_skips_steps_until_too_many(policy: str) -> None:
    """The guard itself, in-process, on a real model and optimizer: `stop` reads its device counter only where a
    decision needs it and then cancels the save; `skip` leaves weights and moments untouched and stops after
    MAX_SKIPS_IN_A_ROW steps in a row."""
    from transformers import TrainerControl, TrainerState

    from trainer.run.divergence import MAX_SKIPS_IN_A_ROW, DivergenceGuard

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    guard, state, control = DivergenceGuard(policy), TrainerState(), TrainerControl()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    steps = MAX_SKIPS_IN_A_ROW if policy == "skip" else 3
    for _ in range(steps):
        model(torch.ones(1, 4)).sum().backward()
        model.weight.grad[0, 0] = float("nan")
        guard.on_pre_optimizer_step(None, state, control, model=model)
        optimizer.step()
        optimizer.zero_grad()
        state.global_step += 1
        guard.on_step_end(None, state, control, model=model)
        if policy == "stop":
            assert guard.diverged_at is None  # nothing read yet: no decision at a step that neither logs nor saves
    control.should_save = True  # the save at the last step: AtomicCheckpointTrainer asks the guard first
    assert guard.allows_save(state, control, model) is False
    assert guard.diverged_at == (1 if policy == "stop" else steps)
    assert control.should_training_stop and not control.should_save
    if policy == "skip":
        assert guard.skipped == steps
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # every step skipped
        assert not optimizer.state  # no moments either
