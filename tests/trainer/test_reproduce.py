"""`python -m trainer reproduce` (issue 38 item 2, in-image half; issue 40 item 5): real tiny runs, no mocks.

One 4-step run (one epoch of a 282-byte corpus, so every byte is trained on) with a token in the environment. Its
reproduce has the same loss at every step and says so, publishes a complete folder, and neither its output nor its
report holds the token. One byte changed in the data: refused naming the file (with --allow-changed-data, the
first differing step: tests/images/test_registry.py, in the image). Bad input exits 2 with the fix (no
provenance, a non-empty destination, steps out of range, other GPUs, a missing data file), and a SIGTERM
mid-run leaves the staging folder only, never a destination that looks complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, base_env, run_trainer
from train_runs import finish, start, train_env
from waiting import wait_for

SECRET = "hf_reproduceToken123456789"
CORPUS = "".join(f"{i}: the quick brown fox jumps over the lazy dog\n" for i in range(6))


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reproduce")
    (folder / "small.txt").write_text(CORPUS)
    out = folder / "run"
    code, err = finish(start({**train_env(out, max_steps=4, data=folder / "small.txt"), "HF_TOKEN": SECRET}))
    assert code == 0, err[-3000:]
    return out


def reproduce(*args: object) -> subprocess.CompletedProcess:
    return run_trainer(["reproduce", *map(str, args)], env={"PYTHONPATH": str(REPO), "HF_TOKEN": SECRET})


def data_file(run: Path) -> Path:
    return Path(next(iter(json.loads((run / "provenance.json").read_text())["data"])))


def test_the_same_loss_at_every_step_and_a_changed_data_file_refused(original: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    result = reproduce(original, "--output", again)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"reproduced: the loss of all 4 logged steps is identical to the original's ({again})" in result.stdout
    assert "recorded inputs that differ: none" in result.stdout
    report = json.loads((again / "reproduce.json").read_text())
    assert report["identical"] is True and report["steps"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # published by a rename: no staging left
    for text in (result.stdout, result.stderr, *(p.read_text() for p in again.glob("*.json"))):
        assert SECRET not in text

    data = data_file(original)
    data.write_bytes(CORPUS.replace("quick", "quack", 1).encode())  # one byte
    try:
        refused = reproduce(original, "--output", tmp_path / "refused")
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert f"{data} changed" in refused.stderr and "--allow-changed-data" in refused.stderr
        assert "Traceback" not in refused.stderr and not (tmp_path / "refused").exists()
    finally:
        data.write_text(CORPUS)


def copy_record(run: Path, folder: Path, **provenance: object) -> Path:
    """The run's records (no weights) in `folder`, with provenance.json's keys replaced by `provenance`."""
    folder.mkdir()
    for name in ("run_config.json", "metrics.jsonl"):
        shutil.copy(run / name, folder / name)
    record = {**json.loads((run / "provenance.json").read_text()), **provenance}
    (folder / "provenance.json").write_text(json.dumps(record))
    return folder


def test_bad_input_exits_2_naming_what_is_missing_and_the_fix(original: Path, tmp_path: Path) -> None:
    older = tmp_path / "older"
    older.mkdir()
    (older / "run_config.json").write_text("{}")
    gpus = copy_record(original, tmp_path / "gpus", accelerator={"gpus": ["NVIDIA H100 80GB HBM3"]})
    gone = copy_record(original, tmp_path / "gone", data={str(tmp_path / "gone.txt"): {"sha256": "0" * 64}})
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    cases = [
        ((older,), [f"{older / 'provenance.json'} is missing", "older trainkit"]),
        ((original, "--output", busy), [f"--output {busy}: the folder is not empty", "--replace"]),
        ((original, "--steps", 9), ["--steps 9: the run logged steps 1 to 4"]),
        ((gpus, "--output", tmp_path / "x"), ["NVIDIA H100 80GB HBM3", "no GPU (the CPU)", "--allow-other-gpus"]),
        ((gone, "--output", tmp_path / "x"), [f"{tmp_path / 'gone.txt'} is missing", "--allow-changed-data"]),
    ]
    for args, needles in cases:
        result = reproduce(*args)
        assert result.returncode == 2, (args, result.stderr[-2000:])
        assert "Traceback" not in result.stderr
        for needle in needles:
            assert needle in result.stderr, (needle, result.stderr)
    assert (busy / "keep.txt").read_text() == "mine" and not (tmp_path / "x").exists()


def test_sigterm_leaves_no_output_that_looks_complete(original: Path, tmp_path: Path) -> None:
    """Held (SIGSTOP, with its training child) once its staging folder exists, a reproduce meets a second one into
    the same --output, which exits 2 naming it and leaves the staging folder alone; then SIGTERM stops the first."""
    again, staging = tmp_path / "again", tmp_path / ".tmp-reproduce-again"
    env = {**base_env(), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([PYTHON, "-m", "trainer", "reproduce", str(original), "--output", str(again)], env=env,
                            cwd=REPO, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    wait_for(staging.is_dir, 120, "the staging folder", interval=0.005, proc=proc)
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        second = reproduce(original, "--output", again)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # as `docker stop` and Slurm do: the whole group
        os.killpg(proc.pid, signal.SIGCONT)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert f"reproduce --output {again}: another reproduce is writing it (pid {proc.pid} on host" in second.stderr
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert re.search(rf"{re.escape(str(staging))} is unfinished and {re.escape(str(again))} was not written", err)
    assert not again.exists()

