"""The launcher reports the trainer's real outcome after a stop (trainer.launch.supervise), with real processes:
`python -m trainer.launch` -> (torchrun ->) `python -m trainer` on the tiny preset.

A trainer killed during its stop checkpoint (as the OOM killer does) is not "checkpoint written" (143): the
launcher says so and exits 137, one process or two behind torchrun (which itself exits 1 for any failed worker).
Two ranks resume from the checkpoint rank 0 chose, and each says so (trainer.run.train._resume_from).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from train_runs import children, finish, logged_steps, start, train_env
from waiting import wait_for

from trainer.run.checkpoint import SAVE_DELAY_ENV


def _trainers(launcher: int, nproc: int) -> list[int]:
    below = children(launcher)
    return below if nproc == 1 else [pid for torchrun in below for pid in children(torchrun)]


def _stop_then_kill_one_trainer(proc: subprocess.Popen[str], out: Path, nproc: int, after_step: int) -> None:
    """SIGTERM to the launcher, then SIGKILL to one trainer while the stop checkpoint is being written."""
    wait_for(lambda: after_step in logged_steps(out), 300, f"step {after_step}", proc=proc)
    trainers = _trainers(proc.pid, nproc)
    assert len(trainers) == nproc
    os.kill(proc.pid, signal.SIGTERM)
    wait_for(lambda: list(out.glob(".tmp-checkpoint-*")), 300, "a save", proc=proc)
    os.kill(trainers[-1], signal.SIGKILL)


def test_a_trainer_killed_during_the_stop_checkpoint_is_not_reported_as_stopped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start({**train_env(out, max_steps=200), SAVE_DELAY_ENV: "10@*"}, ["-m", "trainer.launch"])
    _stop_then_kill_one_trainer(proc, out, 1, after_step=2)
    code, err = finish(proc)
    assert code == -signal.SIGKILL, err[-3000:]  # the launcher dies the way its trainer died
    assert not list(out.glob("checkpoint-*"))


@pytest.fixture(scope="module")
def stopped_after_the_last_step(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str, dict[str, str]]:
    """Two ranks, 3 steps, the stop reaching them while checkpoint-3 is being written: (output folder, exit code,
    log, environment). test_two_ranks_... resumes a copy of its checkpoint-3 (no second 2-rank run to make one)."""
    out = tmp_path_factory.mktemp("last-step") / "out"
    env = train_env(out, max_steps=3, save_steps=3, nproc_per_node=2, max_restarts=0)
    proc = start({**env, SAVE_DELAY_ENV: "5@3"}, ["-m", "trainer.launch"])
    wait_for(lambda: (out / ".tmp-checkpoint-3").is_dir(), 300, "the save of step 3", proc=proc)
    os.kill(proc.pid, signal.SIGTERM)
    code, err = finish(proc)
    return out, code, err, env


def test_two_ranks_resume_from_rank_0s_choice_and_a_kill_in_the_stop_is_reported(
    stopped_after_the_last_step: tuple[Path, int, str, dict[str, str]], tmp_path: Path
) -> None:
    """Rank 0 decides the resume checkpoint and broadcasts it (each rank logs it); then a rank killed during the
    stop checkpoint makes the launcher exit 137, not 143 (torchrun itself exits 1)."""
    finished, code, err, env = stopped_after_the_last_step
    assert code == 0, err[-3000:]
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    env = {**env, "TRAIN_OUTPUT_DIR": str(out)}

    proc = start({**env, "TRAIN_MAX_STEPS": "200", SAVE_DELAY_ENV: "10@*"}, ["-m", "trainer.launch"])
    _stop_then_kill_one_trainer(proc, out, 2, after_step=4)
    code, err = finish(proc)
    assert f"[rank 0/2] INFO resume: continuing from {out / 'checkpoint-3'}" in err
    assert f"[rank 1/2] WARNING resume: rank 1 continues from {out / 'checkpoint-3'} (rank 0's choice)" in err
    assert code == 137, err[-3000:]
    assert "ended without an exit code (killed" in err
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-3"]


def test_a_stop_after_the_last_step_lets_the_run_and_torchrun_finish(
    stopped_after_the_last_step: tuple[Path, int, str, dict[str, str]],
) -> None:
    """The stop reaches two ranks while the last step's checkpoint is being written (past the step's stop
    agreement): the run finishes (final/, exit 0) and says so, and the launcher leaves torchrun to end by itself.
    Killed, torchrun would skip its exit barrier, and on a cluster the other nodes' torchruns wait for it 300 s."""
    out, code, err, _env = stopped_after_the_last_step
    assert code == 0, err[-3000:]
    assert (out / "final" / "config.json").is_file() and (out / "checkpoint-3").is_dir()
    assert err.count("the stop came after the last step: finishing the run (final/, exit 0) instead") == 2
    assert "every trainer process finished the run before the stop reached it; torchrun ends by itself" in err
    assert "death signal" not in err and "SignalException" not in err, err[-3000:]
