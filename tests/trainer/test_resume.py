"""Interruption and resume, with real `python -m trainer` subprocesses on the tiny preset.

- SIGTERM mid-run: exit 143, "interrupted" in the log, a complete checkpoint at the step it stopped at; the
  restart resumes from that step (without tokenizing again) and ends with weights identical to an
  uninterrupted run's.
- kill -9 during a save: the partial `.tmp-checkpoint-N` is never taken for a checkpoint; the restart removes it
  and resumes from the last complete one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer.checkpoint import COMPLETE_MARKER, SAVE_DELAY_ENV

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 8


def train_env(out: Path, **train: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_") and k != SAVE_DELAY_ENV}
    base = {
        "output_dir": out, "seq_len": 32, "batch_size": 2, "num_workers": 0, "log_steps": 1,
        "max_steps": MAX_STEPS, "save_steps": 100, "seed": 7, "deterministic": 1,
    }  # fmt: skip
    env.update({f"TRAIN_{k.upper()}": str(v) for k, v in {**base, **train}.items()})
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], timeout: float = 400) -> tuple[int, str]:
    _out, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def wait_for(condition, proc: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the trainer")
        time.sleep(0.05)


def logged_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def global_step(checkpoint: Path) -> int:
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


@pytest.fixture(scope="module")
def sigterm_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """An uninterrupted reference run, and a run sent SIGTERM after step 2 then restarted (the two run together)."""
    tmp = tmp_path_factory.mktemp("resume")
    data = tmp / "data.txt"
    data.write_text("".join(f"Line {i}: a short sentence about resuming training, number {i}.\n" for i in range(400)))
    ref_out, out = tmp / "reference", tmp / "interrupted"
    reference = start(train_env(ref_out, data=data))
    interrupted = start(train_env(out, data=data))
    wait_for(lambda: 2 in logged_steps(out), interrupted)
    interrupted.send_signal(signal.SIGTERM)
    code, err = finish(interrupted)
    checkpoints = sorted(out.glob("checkpoint-*"))
    restart_code, restart_err = finish(start(train_env(out, data=data)))
    ref_code, ref_err = finish(reference)
    assert ref_code == 0, ref_err[-3000:]
    return {
        "out": out, "ref_out": ref_out, "code": code, "err": err, "checkpoints": checkpoints,
        "restart_code": restart_code, "restart_err": restart_err,
    }  # fmt: skip


def test_sigterm_exits_143_with_a_checkpoint_and_says_interrupted(sigterm_runs) -> None:
    r = sigterm_runs
    assert r["code"] == 143, r["err"][-3000:]
    assert "interrupted" in r["err"]
    assert len(r["checkpoints"]) == 1
    checkpoint = r["checkpoints"][0]
    step = global_step(checkpoint)
    assert 2 <= step < MAX_STEPS and checkpoint.name == f"checkpoint-{step}"
    assert (checkpoint / COMPLETE_MARKER).is_file()


def test_restart_continues_from_the_interrupted_step(sigterm_runs) -> None:
    r = sigterm_runs
    assert r["restart_code"] == 0, r["restart_err"][-3000:]
    step = global_step(r["checkpoints"][0])
    assert f"continuing from {r['out'] / f'checkpoint-{step}'}" in r["restart_err"]
    assert "from the cache" in r["restart_err"]  # no second tokenization
    assert logged_steps(r["out"]) == list(range(1, MAX_STEPS + 1))  # each step logged once, none lost


def test_resumed_weights_equal_an_uninterrupted_run(sigterm_runs) -> None:
    r = sigterm_runs
    resumed, reference = weights(r["out"] / "final"), weights(r["ref_out"] / "final")
    assert resumed.keys() == reference.keys()
    for name in reference:
        assert torch.equal(resumed[name], reference[name]), name
    # and the run really trained: the final weights differ from the checkpoint it resumed from
    at_interrupt = weights(r["checkpoints"][0])
    assert any(not torch.equal(at_interrupt[n], resumed[n]) for n in resumed)


def test_kill_9_during_a_save_resumes_from_the_last_complete_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = train_env(out, save_steps=2, max_steps=6)
    proc = start({**env, SAVE_DELAY_ENV: "60@4"})  # the save of step 4 lingers before its completion marker
    wait_for(lambda: (out / ".tmp-checkpoint-4").is_dir(), proc)
    assert (out / "checkpoint-2" / COMPLETE_MARKER).is_file()
    assert not (out / "checkpoint-4").exists()  # the save in progress is invisible under its final name
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    code, err = finish(start(env))
    assert code == 0, err[-3000:]
    assert ".tmp-checkpoint-4, left by an interrupted save" in err
    assert f"continuing from {out / 'checkpoint-2'}" in err
    assert not list(out.glob(".tmp-*"))
    assert global_step(out / "checkpoint-6") == 6 and (out / "final" / "model.safetensors").is_file()


def test_repeated_signals_during_the_save_do_not_abort_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start({**train_env(out, max_steps=200), SAVE_DELAY_ENV: "3@*"})
    wait_for(lambda: 1 in logged_steps(out), proc)
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: bool(list(out.glob(".tmp-checkpoint-*"))), proc)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc)
    assert code == 143, err[-3000:]
    assert "received again" in err and "interrupted by SIGTERM" in err
    (checkpoint,) = out.glob("checkpoint-*")
    assert (checkpoint / COMPLETE_MARKER).is_file() and not list(out.glob(".tmp-*"))


def test_resume_path_without_completion_marker_is_refused(tmp_path: Path) -> None:
    partial = tmp_path / "out" / "checkpoint-3"
    partial.mkdir(parents=True)
    (partial / "trainer_state.json").write_text('{"global_step": 3}')
    proc = subprocess.run(
        [sys.executable, "-m", "trainer"],
        cwd=REPO,
        env=train_env(tmp_path / "out", resume=partial),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert COMPLETE_MARKER in proc.stderr and "Traceback" not in proc.stderr
