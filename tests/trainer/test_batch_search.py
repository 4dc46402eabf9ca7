"""TRAIN_AUTO_BATCH finds the largest batch that fits, searching up and down, and the ranks agree (issue 10 item 10).

A CPU has no out-of-memory error to search against, so the GPU's memory limit is the one thing stood in for:
a forward pre-hook raises the error a GPU raises above a given batch. Everything else is real: the search, the
probe (forward and backward of the tiny preset, gradients freed after each try), two torchrun ranks agreeing over
gloo, and `python -m trainer` recording the decision. The real CUDA out-of-memory search is
tests/gpu/test_auto_batch_gpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import base_env

from trainer.run.batch_search import memory_probe, search_largest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.mark.parametrize(
    ("limit", "start", "ceiling", "why"),
    [
        (37, 8, 256, "upward: doubles past TRAIN_BATCH_SIZE, then bisects"),
        (5, 8, 256, "downward: TRAIN_BATCH_SIZE does not fit"),
        (256, 8, 256, "everything fits: stops at the ceiling"),
        (300, 8, 100, "the ceiling is not a power of two"),
        (8, 8, 256, "exactly TRAIN_BATCH_SIZE"),
        (1, 8, 256, "only 1 fits"),
        (0, 8, 256, "nothing fits"),
    ],
)
def test_search_finds_the_largest_size_that_fits(limit: int, start: int, ceiling: int, why: str) -> None:
    found = search_largest(lambda size: size <= limit, start, ceiling)
    assert found.batch == min(limit, ceiling), why
    assert len(found.probes) <= 2 * ceiling.bit_length() + 1, found.probes  # logarithmic, not a walk


def test_the_probe_runs_real_steps_and_turns_out_of_memory_into_no() -> None:
    sys.path.insert(0, str(HERE))
    from batch_search_ranks import SEQ, tiny_model_with_memory_limit

    model = tiny_model_with_memory_limit(19)
    fits = memory_probe(model, SEQ, model.config.vocab_size, torch.device("cpu"), "fp32", reserve=1 << 20)
    found = search_largest(fits, 8, 256)
    assert found.batch == 19 and (32, False) in found.probes and (16, True) in found.probes
    assert all(p.grad is None for p in model.parameters())  # each probe frees what it allocated


def test_two_ranks_end_on_the_batch_that_fits_both(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    script = str(HERE / "batch_search_ranks.py")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", script, str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"search.{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["batch"] == ranks[1]["batch"] == 23  # rank 1's device is the smaller
    assert ranks[0]["probes"] == ranks[1]["probes"]  # the same sizes, the same agreed verdicts
    assert not ranks[0]["grads_left"] and not ranks[1]["grads_left"]


def test_auto_batch_on_a_cpu_keeps_the_batch_and_says_why(run_trainer, trainer_env, text_file) -> None:
    output = Path(trainer_env["TRAIN_OUTPUT_DIR"])
    env = {
        **trainer_env, "TRAIN_DATA": str(text_file), "TRAIN_AUTO_BATCH": "1", "TRAIN_BATCH_SIZE": "3",
        "TRAIN_SEQ_LEN": "32", "TRAIN_MAX_STEPS": "2", "TRAIN_LOG_STEPS": "1", "TRAIN_SAVE_STEPS": "2",
        "TRAIN_PROFILE": "1",
    }  # fmt: skip
    result = run_trainer([], env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    decision = json.loads((output / "run_config.json").read_text())["decisions"]["batch_size"]
    assert decision["value"] == 3 and "needs a GPU" in decision["reason"]
    assert result.stderr.count("profile: recording steps") == 1  # one profiler for the run
    state = json.loads((output / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["train_batch_size"] == 3


def test_with_compile_on_the_search_probes_the_compiled_model_and_training_peak_is_its_own(tmp_path: Path) -> None:
    """Issue 42 items 1 and 2: one compile serves every probed size (the batch dimension is dynamic), the forward
    and backward that run are the compiled ones, and after the search the peak memory is the training step's."""
    proc = subprocess.run([sys.executable, str(HERE / "compiled_search_peak.py")], cwd=HERE, capture_output=True,
                          env={**base_env(tmp_path), "PYTHONPATH": str(REPO)}, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    probes = [tuple(p) for p in found["probes"]]
    assert found["batch"] == 24 and (32, False) in probes and (16, True) in probes, probes
    assert found["how"].startswith("probed compiled"), found["how"]
    assert found["unique_graphs"] >= 1  # the probes ran compiled code ...
    assert not found["recompiles"], found["recompiles"]  # ... compiled once for every size
    assert not found["grads_left"]
    assert found["step_peak"] < found["probes_peak"] - (50 << 20)  # the metric is the step's peak, not the probes'


@pytest.mark.parametrize(
    ("error", "oom"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
        (RuntimeError("expected scalar type Float but found Half"), False),
        (ValueError("out of memory."), False),
    ],
)
def test_every_out_of_memory_form_is_a_batch_that_does_not_fit(error: BaseException, oom: bool) -> None:
    from trainer.run.batch_search import is_out_of_memory

    assert is_out_of_memory(error) is oom
    wrapped = RuntimeError("backend compiler failed")
    wrapped.__cause__ = error
    assert is_out_of_memory(wrapped) is oom


def test_a_searched_batch_is_remembered_for_the_same_key_only(tmp_path: Path) -> None:
    from trainer.run.batch_search import cached_batch, remember_batch, search_cache_file

    key = {"model": "1b", "seq_len": 2048, "gpu": "NVIDIA H200", "versions": {"torch": "2.11.0"}}
    path = search_cache_file(str(tmp_path), key)
    assert cached_batch(path, key) is None
    remember_batch(path, key, 29, "probed 8 fits, 16 fits, 32 out of memory")
    assert cached_batch(path, key) == (29, "probed 8 fits, 16 fits, 32 out of memory")
    other = {**key, "versions": {"torch": "2.12.0"}}
    assert search_cache_file(str(tmp_path), other) != path and cached_batch(path, other) is None
    path.write_text('{"key": ')  # a torn record is no result
    assert cached_batch(path, key) is None
