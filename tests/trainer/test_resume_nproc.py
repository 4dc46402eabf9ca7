"""A run resumed on another process count goes on by the sequences it trained, with real runs through the image's
launcher (`python -m trainer.launch`: torchrun over gloo on the CPU for two processes) on the tiny preset.

One chain per sharding backend, the user's settings the same throughout (TRAIN_GRAD_ACCUM=2, TRAIN_MAX_STEPS=4):
one process trains steps 1-4 (the uninterrupted reference); its checkpoint-2 goes on on two
processes (1 -> 2: accumulation 2 -> 1, and ZeRO's state through DeepSpeed's universal checkpoint), whose
checkpoint-3 goes on on one process again (2 -> 1). Each step trains the same 4 sequences as the reference: the
losses match it, and each checkpoint's record counts the sequences trained.

ZeRO-2 runs in the default suite (about 3 minutes here); ZeRO-3 and FSDP (which on CPUs accelerate runs as DDP:
whole state, no sharding) cost as much each and run with `--all-reshards`, as do the same two on tiny-moe (a mixture
of experts: its fused expert tensors go through ZeRO's universal checkpoint like any other). The uneven case and
ZeRO's NVMe offload are refused before anything loads (tests/trainer/test_resume_decide.py).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from helpers import write_corpus
from train_runs import finish, start, train_env

from trainer.checkpoint_record import read_record

BACKENDS = {"zero2": {"zero_stage": 2}, "zero3": {"zero_stage": 3}, "fsdp": {"fsdp": "full_shard"},
            # a mixture of experts: its fused expert tensors partitioned (ZeRO-3) or sharded (FSDP) like the rest
            "zero3-moe": {"zero_stage": 3, "model": "tiny-moe"},
            "fsdp-moe": {"fsdp": "full_shard", "model": "tiny-moe"}}
IN_THE_DEFAULT_SUITE = ("zero2",)
LAUNCHER = ("-m", "trainer.launch")
LOSS_NOISE = 1e-3  # float reduction order (two processes' all-reduce against one process's accumulation)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "data.txt")


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row["loss"] for row in rows}


def _run(env: dict[str, str], timings: dict[str, float], name: str) -> str:
    started = time.monotonic()
    code, err = finish(start(env, LAUNCHER), timeout=600)
    timings[name] = round(time.monotonic() - started, 1)
    assert code == 0, err[-5000:]
    return err


def _continue_from(checkpoint: Path, out: Path) -> None:
    out.mkdir()
    shutil.copytree(checkpoint, out / checkpoint.name)


def _batch(checkpoint: Path) -> dict[str, int]:
    record = read_record(checkpoint)
    assert record is not None and record.batch is not None, checkpoint
    return record.batch.as_json()


@pytest.mark.slow
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_resume_on_two_then_one_process_goes_on_by_the_sequences_trained(
    backend: str, corpus: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend not in IN_THE_DEFAULT_SUITE and not request.config.getoption("--all-reshards"):
        pytest.skip(f"{backend}: about 3 minutes on 2 cores; run with --all-reshards")
    # a checkpoint every step in every run: a resumed Transformers run keeps the save_steps of the run it continues
    run = {"data": corpus, "grad_accum": 2, "max_steps": 4, "save_steps": 1, "max_restarts": 0, **BACKENDS[backend]}
    timings: dict[str, float] = {}
    one, two, back = tmp_path / "one", tmp_path / "two", tmp_path / "back"
    _run(train_env(one, **run), timings, "1 process, steps 1-4")
    reference = _losses(one)
    assert _batch(one / "checkpoint-2") == {"processes": 1, "per_device": 2, "accumulation": 2, "samples_seen": 8}

    _continue_from(one / "checkpoint-2", two)
    err = _run(train_env(two, nproc_per_node=2, **run), timings, "2 processes, steps 3-4")
    assert "1 -> 2 process(es): accumulation 2 -> 1 keeps the effective batch (4 -> 4 sequences per step" in err
    assert "8 sequences already trained (step 2)" in err
    if not backend.startswith("fsdp"):
        assert "converted to its universal checkpoint" in err
    assert not (two / ".reshard").exists()
    assert _batch(two / "checkpoint-3") == {"processes": 2, "per_device": 2, "accumulation": 1, "samples_seen": 12}

    _continue_from(two / "checkpoint-3", back)
    err = _run(train_env(back, **run), timings, "1 process, step 4")
    assert "2 -> 1 process(es): accumulation 1 -> 2 keeps the effective batch" in err
    assert "12 sequences already trained (step 3)" in err
    assert _batch(back / "checkpoint-4") == {"processes": 1, "per_device": 2, "accumulation": 2, "samples_seen": 16}

    resumed = {**_losses(two), **_losses(back)}
    print(f"{backend}: reference {reference}; 1 -> 2 {_losses(two)}; 2 -> 1 {_losses(back)}; seconds {timings}")
    assert sorted(_losses(two)) == [3, 4] and sorted(_losses(back)) == [4]
    for step in (3, 4):
        assert abs(resumed[step] - reference[step]) < LOSS_NOISE, (step, resumed[step], reference[step])
    assert abs(_losses(two)[4] - _losses(back)[4]) < LOSS_NOISE
