"""Every way a run is stopped writes a complete checkpoint and resumes exactly; real processes, real signals.

The runs use the default DataLoader workers (TRAIN_NUM_WORKERS=2) and a signal is sent the way schedulers send it:
to the trainer's PID, or to its whole process group (dumb-init, `docker stop`, Slurm), at several moments of the
run; and across a 2-process torchrun over gloo. Expected: exit 143 (130 for SIGINT), "interrupted" in the log, one
complete checkpoint at the step the run stopped at, never "DataLoader worker ... killed", and a restart that
continues from that step and ends with weights `torch.equal` to an uninterrupted run's.

The stops that share the run's settings are one chain on one output folder: a fresh run stopped while its workers
load the first batch, whose restart is stopped during a step by SIGTERM to its PID, whose restart is stopped so
to its group, whose restart is stopped by SIGINT, whose restart runs to the end (each restart is the stopped run's
resume, checked as such); a stop during a save (a checkpoint every 2 steps) is a run and restart of its own.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
from train_runs import (
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
STEPS = 16  # room for the chain's four stops (below), each two steps into its run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "data.txt")


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final weights of an uninterrupted run."""
    out = tmp_path_factory.mktemp("reference")
    code, err = finish(start(train_env(out, data=corpus, max_steps=STEPS)))
    assert code == 0, err[-3000:]
    return out / "final"


def _after_its_step_2(out: Path, proc, resumed_from: int) -> None:
    wait_for(lambda: resumed_from + 2 in logged_steps(out), 300, f"step {resumed_from + 2}", proc=proc)


def _while_workers_load_the_first_batch(out: Path, proc, resumed_from: int) -> None:
    # the workers were just forked for the first batch
    wait_for(lambda: len(children(proc.pid)) >= 2, 300, "two DataLoader workers", proc=proc)


def _during_the_save_of_step_2(out: Path, proc, resumed_from: int) -> None:
    wait_for(lambda: (out / ".tmp-checkpoint-2").is_dir(), 300, "the save of step 2", proc=proc)


# moment: (signal, to the whole group, when, TRAIN_* settings and variables of its runs)
MOMENTS = {
    "pid-during-a-step": (signal.SIGTERM, False, _after_its_step_2, {}),
    "group-during-a-step": (signal.SIGTERM, True, _after_its_step_2, {}),
    "group-while-workers-load": (signal.SIGTERM, True, _while_workers_load_the_first_batch, {}),
    "group-during-a-save": (signal.SIGTERM, True, _during_the_save_of_step_2, {"save_steps": 2, SAVE_DELAY_ENV: "3@2"}),
    "sigint-to-the-group": (signal.SIGINT, True, _after_its_step_2, {}),
}
# the order the chain's runs are stopped in: the first one fresh, each next one the restart of the one before
CHAIN = ("group-while-workers-load", "pid-during-a-step", "group-during-a-step", "sigint-to-the-group")


@dataclass
class Stop:
    """A run stopped at a moment, what its output folder held right after, and the log of its restart."""

    code: int
    err: str
    stopped: int
    complete: bool  # its checkpoint's
    global_step: int  # its checkpoint's
    left: list[Path]  # .tmp-* folders
    written: set[str]  # the checkpoints it added
    restart_err: str = ""


def _envs(moment: str, corpus: Path, out: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The run's environment, and the same with the moment's variables (a save's delay) for the run stopped."""
    extra = MOMENTS[moment][3]
    env = train_env(out, data=corpus, max_steps=STEPS, **{k: v for k, v in extra.items() if k != SAVE_DELAY_ENV})
    return env, {**env, **{k: v for k, v in extra.items() if k == SAVE_DELAY_ENV}}


def _stopped(moment: str, env: dict[str, str], out: Path, resumed_from: int) -> Stop:
    sig, to_group, wait, _ = MOMENTS[moment]
    before = {p.name for p in out.glob("checkpoint-*")}
    proc = start(env)
    wait(out, proc, resumed_from)
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    code, err = finish(proc)
    found = re.search(r"checkpoint-(\d+) written", err)
    assert found, f"{moment}: exit {code}\n{err[-3000:]}"
    stopped = int(found[1])
    checkpoint = out / f"checkpoint-{stopped}"
    return Stop(code, err, stopped, (checkpoint / COMPLETE_MARKER).is_file(), global_step(checkpoint),
                list(out.glob(".tmp-*")), {p.name for p in out.glob("checkpoint-*")} - before)  # fmt: skip


@pytest.fixture(scope="module")
def chain(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Stop]]:
    """The output folder and each CHAIN moment's stop; a stop's restart is the next one's run, the last one's runs to
    the end."""
    out = tmp_path_factory.mktemp("chain") / "out"
    env, _ = _envs(CHAIN[0], corpus, out)
    stops: dict[str, Stop] = {}
    for moment in CHAIN:
        stops[moment] = _stopped(moment, env, out, stops[CHAIN[len(stops) - 1]].stopped if stops else 0)
    code, err = finish(start(env))
    assert code == 0, err[-3000:]
    for moment, restart in zip(CHAIN, [*CHAIN[1:], None], strict=True):
        stops[moment].restart_err = stops[restart].err if restart else err
    return out, stops


def _assert_resumed_exactly(out: Path, stop: Stop, reference: Path) -> None:
    assert f"continuing from {out / f'checkpoint-{stop.stopped}'}" in stop.restart_err, stop.restart_err[-3000:]
    assert "from the cache" in stop.restart_err  # no second tokenization
    assert logged_steps(out) == list(range(1, STEPS + 1))  # each step logged once, none lost
    assert_same_weights(out / "final", reference)


@pytest.mark.parametrize("moment", [m for m in MOMENTS if MOMENTS[m][0] == signal.SIGTERM])
def test_sigterm_checkpoints_exits_143_and_resumes_exactly(
    moment: str, corpus: Path, reference: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if moment in CHAIN:
        out, stops = request.getfixturevalue("chain")
        stop = stops[moment]
    else:
        out = tmp_path / "out"
        env, stopped_env = _envs(moment, corpus, out)
        stop = _stopped(moment, stopped_env, out, 0)
        restart_code, stop.restart_err = finish(start(env))
        assert restart_code == 0, stop.restart_err[-3000:]

    assert stop.code == 143, stop.err[-3000:]
    assert "interrupted by SIGTERM" in stop.err and WORKER_DEATH not in stop.err
    assert stop.complete and stop.global_step == stop.stopped
    assert 1 <= stop.stopped < STEPS and not stop.left
    _assert_resumed_exactly(out, stop, reference)


def test_sigint_to_the_group_exits_130_with_a_checkpoint(chain: tuple[Path, dict[str, Stop]], reference: Path) -> None:
    out, stops = chain
    stop = stops["sigint-to-the-group"]
    assert stop.code == 130, stop.err[-3000:]
    assert "interrupted by SIGINT" in stop.err and WORKER_DEATH not in stop.err and "KeyboardInterrupt" not in stop.err
    assert stop.written == {f"checkpoint-{stop.stopped}"} and stop.complete
    _assert_resumed_exactly(out, stop, reference)


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
