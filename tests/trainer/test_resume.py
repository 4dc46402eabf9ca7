"""Saves that are cut short, with real `python -m trainer` subprocesses on the tiny preset (default DataLoader
workers); SIGTERM/SIGINT and the exact resume after them are in test_stop_signals.py.

- kill -9 during a save: the partial `.tmp-checkpoint-N` is never taken for a checkpoint; the restart removes it
  and resumes from the last complete one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from train_runs import (
    REPO,
    finish,
    global_step,
    logged_steps,
    start,
    train_env,
)
from waiting import wait_for

from trainer.checkpoint_record import COMPLETE_MARKER
from trainer.run.checkpoint import SAVE_DELAY_ENV


def test_kill_9_during_a_save_resumes_from_the_last_complete_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = train_env(out, save_steps=2, max_steps=6)
    proc = start({**env, SAVE_DELAY_ENV: "60@4"})  # the save of step 4 lingers before its completion marker
    wait_for(lambda: (out / ".tmp-checkpoint-4").is_dir(), 300, "the save of step 4", proc=proc)
    assert (out / "checkpoint-2" / COMPLETE_MARKER).is_file()
    assert not (out / "checkpoint-4").exists()  # the save in progress is invisible under its final name
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    code, err = finish(start({**env, "TRAIN_SAVE_STEPS": "3"}))  # a changed interval is the resumed run's
    assert code == 0, err[-3000:]
    assert ".tmp-checkpoint-4, left by an interrupted save" in err
    assert f"continuing from {out / 'checkpoint-2'}" in err and "TRAIN_SAVE_STEPS was 2, now 3" in err
    assert not list(out.glob(".tmp-*"))
    assert (out / "checkpoint-3").is_dir() and not (out / "checkpoint-4").exists()
    assert global_step(out / "checkpoint-6") == 6 and (out / "final" / "model.safetensors").is_file()


def test_repeated_signals_during_the_save_do_not_abort_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start({**train_env(out, max_steps=200), SAVE_DELAY_ENV: "3@*"})
    wait_for(lambda: 1 in logged_steps(out), 300, "step 1", proc=proc)
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: list(out.glob(".tmp-checkpoint-*")), 300, "a save", proc=proc)
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
