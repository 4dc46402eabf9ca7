"""The launcher reports the trainer's real outcome after a stop (trainer.launch.supervise), with real processes:
`python -m trainer.launch` -> (torchrun ->) `python -m trainer` on the tiny preset.

A trainer killed during its stop checkpoint (as the OOM killer does) is not "checkpoint written" (143): the
launcher says so and exits 137, one process or two behind torchrun (which itself exits 1 for any failed worker).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from train_runs import children, finish, logged_steps, start, train_env, wait_for

from trainer.run.checkpoint import SAVE_DELAY_ENV


def _trainers(launcher: int, nproc: int) -> list[int]:
    below = children(launcher)
    return below if nproc == 1 else [pid for torchrun in below for pid in children(torchrun)]


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_trainer_killed_during_the_stop_checkpoint_is_not_reported_as_stopped(nproc: int, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**train_env(out, max_steps=200, nproc_per_node=nproc, max_restarts=0), SAVE_DELAY_ENV: "10@*"}
    proc = start(env, ["-m", "trainer.launch"])
    wait_for(lambda: 2 in logged_steps(out), proc)
    trainers = _trainers(proc.pid, nproc)
    assert len(trainers) == nproc
    os.kill(proc.pid, signal.SIGTERM)
    wait_for(lambda: bool(list(out.glob(".tmp-checkpoint-*"))), proc)  # the stop checkpoint is being written
    os.kill(trainers[-1], signal.SIGKILL)
    code, err = finish(proc)
    assert code in (137, -signal.SIGKILL), err[-3000:]
    assert not list(out.glob("checkpoint-*"))
    if nproc == 2:
        assert "ended without an exit code (killed" in err
