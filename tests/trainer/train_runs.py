"""Real `python -m trainer` runs for the interruption tests: start, signal, wait, read what they wrote.

Every run starts in its own session (process group), so a test can signal the trainer's whole group, DataLoader
workers included, as dumb-init, `docker stop` and Slurm do, without signalling pytest.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from conftest import base_env
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 8


def train_env(out: Path, **train: object) -> dict[str, str]:
    """The clean base_env() (none of the caller's variables) + TRAIN_* for a short deterministic run on the tiny
    preset, with the user's default DataLoader workers; `train` sets or overrides TRAIN_<KEY> (e.g. max_steps=2)."""
    base = {
        "output_dir": out, "seq_len": 32, "batch_size": 2, "log_steps": 1,
        "max_steps": MAX_STEPS, "save_steps": 100, "seed": 7, "deterministic": 1,
    }  # fmt: skip
    train_vars = {f"TRAIN_{k.upper()}": str(v) for k, v in {**base, **train}.items()}
    return {**base_env(), "PYTHONPATH": str(REPO), **train_vars}


def start(env: dict[str, str], argv: Sequence[str] = ("-m", "trainer")) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 400) -> tuple[int, str]:
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raise
    return proc.returncode, err


def children(pid: int) -> list[int]:
    """The direct child processes of `pid` (e.g. a trainer's DataLoader workers)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the task ended meanwhile
            found += [int(x) for x in (task / "children").read_text().split()]
    return found


def logged_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def stopped_and_resumed(env: dict[str, str], out: Path, after_step: int) -> int:
    """A run stopped by SIGTERM to its group once `after_step` is logged (exit 143, a checkpoint written), then
    started again with the same environment until it ends (exit 0, continuing from that checkpoint): the step it
    stopped at."""
    import os
    import re
    import signal

    from waiting import wait_for

    proc = start(env)
    wait_for(lambda: after_step in logged_steps(out), 300, f"step {after_step}", proc=proc)
    os.killpg(proc.pid, signal.SIGTERM)
    code, err = finish(proc)
    assert code == 143, err[-3000:]
    stopped = int(re.search(r"checkpoint-(\d+) written", err)[1])
    restart_code, restart_err = finish(start(env))
    assert restart_code == 0, restart_err[-3000:]
    assert f"continuing from {out / f'checkpoint-{stopped}'}" in restart_err
    return stopped


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    left, right = weights(a), weights(b)
    assert left.keys() == right.keys()
    for name in right:
        assert torch.equal(left[name], right[name]), name


def global_step(checkpoint: Path) -> int:
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


def write_corpus(path: Path, lines: int = 400) -> Path:
    path.write_text("".join(f"Line {i}: a short sentence about resuming training, number {i}.\n" for i in range(lines)))
    return path


def reproduce_with_edited(run_trainer: Any, run: Path, edited: Path, out: Path) -> subprocess.CompletedProcess:
    """`reproduce` of `run` into `out` while the file `edited` (a reward or tool file the run recorded) has a line
    more than it had; the file is restored after."""
    kept = edited.read_text()
    edited.write_text(kept + "# edited after the run\n")
    try:
        return run_trainer(["reproduce", str(run), "--output", str(out)], env={"PYTHONPATH": str(REPO)})
    finally:
        edited.write_text(kept)
