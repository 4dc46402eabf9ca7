"""Every way a run is stopped writes a complete checkpoint and resumes exactly; real processes, real signals.

The runs use the default DataLoader workers (TRAIN_NUM_WORKERS=2) and a signal is sent the way schedulers send it:
to the trainer's PID, or to its whole process group (dumb-init, `docker stop`, Slurm), at several moments of the
run; and across a 2-process torchrun over gloo. Expected: exit 143 (130 for SIGINT), "interrupted" in the log, one
complete checkpoint at the step the run stopped at, never "DataLoader worker ... killed", and a restart that
continues from that step and ends with weights `torch.equal` to an uninterrupted run's.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from train_runs import (
    MAX_STEPS,
    assert_same_weights,
    children,
    finish,
    global_step,
    logged_steps,
    start,
    train_env,
    write_corpus,
)
from waiting import wait_for

from trainer.checkpoint_record import COMPLETE_MARKER
from trainer.run.checkpoint import SAVE_DELAY_ENV

WORKER_DEATH = "DataLoader worker"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "data.txt")


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final weights of an uninterrupted run."""
    out = tmp_path_factory.mktemp("reference")
    code, err = finish(start(train_env(out, data=corpus)))
    assert code == 0, err[-3000:]
    return out / "final"


def _after_step_2(out: Path, proc) -> None:
    wait_for(lambda: 2 in logged_steps(out), 300, "step 2", proc=proc)


def _while_workers_load_the_first_batch(out: Path, proc) -> None:
    # the workers were just forked for the first batch
    wait_for(lambda: len(children(proc.pid)) >= 2, 300, "two DataLoader workers", proc=proc)


def _during_the_save_of_step_2(out: Path, proc) -> None:
    wait_for(lambda: (out / ".tmp-checkpoint-2").is_dir(), 300, "the save of step 2", proc=proc)


MOMENTS = {
    "pid-during-a-step": (False, _after_step_2, {}),
    "group-during-a-step": (True, _after_step_2, {}),
    "group-while-workers-load": (True, _while_workers_load_the_first_batch, {}),
    "group-during-a-save": (True, _during_the_save_of_step_2, {"save_steps": 2, SAVE_DELAY_ENV: "3@2"}),
}


@pytest.mark.parametrize("moment", MOMENTS)
def test_sigterm_checkpoints_exits_143_and_resumes_exactly(moment: str, corpus: Path, reference: Path, tmp_path):
    to_group, wait, extra = MOMENTS[moment]
    out = tmp_path / "out"
    delay = {k: v for k, v in extra.items() if k == SAVE_DELAY_ENV}
    env = train_env(out, data=corpus, **{k: v for k, v in extra.items() if k != SAVE_DELAY_ENV})
    proc = start({**env, **delay})
    wait(out, proc)
    (os.killpg if to_group else os.kill)(proc.pid, signal.SIGTERM)
    code, err = finish(proc)

    assert code == 143, err[-3000:]
    assert "interrupted by SIGTERM" in err and WORKER_DEATH not in err
    stopped = int(re.search(r"checkpoint-(\d+) written", err)[1])
    checkpoint = out / f"checkpoint-{stopped}"
    assert (checkpoint / COMPLETE_MARKER).is_file() and global_step(checkpoint) == stopped
    assert 1 <= stopped < MAX_STEPS and not list(out.glob(".tmp-*"))

    restart_code, restart_err = finish(start(env))
    assert restart_code == 0, restart_err[-3000:]
    assert f"continuing from {checkpoint}" in restart_err
    assert "from the cache" in restart_err  # no second tokenization
    assert logged_steps(out) == list(range(1, MAX_STEPS + 1))  # each step logged once, none lost
    assert_same_weights(out / "final", reference)


def test_sigint_to_the_group_exits_130_with_a_checkpoint(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start(train_env(out, data=corpus, max_steps=200))
    _after_step_2(out, proc)
    os.killpg(proc.pid, signal.SIGINT)
    code, err = finish(proc)
    assert code == 130, err[-3000:]
    assert "interrupted by SIGINT" in err and WORKER_DEATH not in err and "KeyboardInterrupt" not in err
    (checkpoint,) = out.glob("checkpoint-*")
    assert (checkpoint / COMPLETE_MARKER).is_file()


def _rank_pids(launcher_pid: int) -> dict[int, int]:
    """{rank: pid} of the trainer processes under `python -m trainer.launch` -> torchrun."""
    found = {}
    for torchrun in children(launcher_pid):
        for pid in children(torchrun):
            env = dict(
                item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item
            )
            if "RANK" in env:
                found[int(env["RANK"])] = pid
    return found


def _stopped_steps(err: str) -> dict[int, int]:
    return {int(r): int(s) for r, s in re.findall(r"\[rank (\d)/2\] WARNING interrupted by \w+: checkpoint-(\d+)", err)}


@pytest.mark.parametrize("target", ["group", "one-rank"])
def test_two_processes_stop_on_the_same_step_with_one_checkpoint(target: str, corpus: Path, tmp_path: Path) -> None:
    """torchrun over gloo (through the image's launcher): SIGTERM to the launcher's group, which torchrun forwards
    to each worker's group, or to rank 1 alone (a node that hears first): both ranks stop on the same step.
    (Workers that exit 143 without torchrun being signalled count as failed; no restarts, so the run ends there.)"""
    out = tmp_path / "out"
    env = train_env(out, data=corpus, max_steps=200, nproc_per_node=2, max_restarts=0)
    proc = start(env, ["-m", "trainer.launch"])
    wait_for(lambda: 3 in logged_steps(out), 300, "step 3", proc=proc)
    if target == "group":
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        os.kill(_rank_pids(proc.pid)[1], signal.SIGTERM)
    code, err = finish(proc)

    stopped = _stopped_steps(err)
    assert stopped.keys() == {0, 1} and stopped[0] == stopped[1], err[-5000:]
    assert WORKER_DEATH not in err
    (checkpoint,) = out.glob("checkpoint-*")
    assert checkpoint.name == f"checkpoint-{stopped[0]}" and (checkpoint / COMPLETE_MARKER).is_file()
    assert global_step(checkpoint) == stopped[0]
    if target == "group":
        assert code == 143, err[-3000:]
    else:
        assert "SIGTERM received by another rank" in err
        assert code != 0
