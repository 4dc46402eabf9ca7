"""TRAIN_AUTO_BATCH finds the largest batch that fits, searching up and down, and the ranks agree (issue 10 item 10).

A CPU has no out-of-memory error to search against, so the GPU's memory limit is the one thing stood in for:
a forward pre-hook raises the error a GPU raises above a given batch. Everything else is real: the search, the
probe (forward and backward of the tiny preset, gradients freed after each try), two torchrun ranks agreeing over
gloo, and `python -m trainer` recording the decision. The real CUDA out-of-memory search is in
tests/gpu/test_gpu_paths.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import base_env

from trainer.run.batch_fit import Probed, memory_limit, search_predicted
from trainer.run.batch_search import memory_probe

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


GIB = 1 << 30


def linear(base: float, per: float, capacity: float) -> Callable[[int], Probed]:
    """A device whose peak at size b is base + per * b (GiB), out of memory above `capacity` GiB."""

    def probe(size: int) -> Probed:
        peak = int((base + per * size) * GIB)
        return Probed(peak <= capacity * GIB, peak if peak <= capacity * GIB else 0)

    return probe


@pytest.mark.parametrize(
    ("base", "per", "limit", "start", "ceiling", "want", "why"),
    [
        (15, 2.5, 125, 8, 256, 44, "upward: 8, 16, then the line's 44 confirmed"),
        (15, 2.5, 30, 8, 256, 6, "downward: 8 is over the limit, 4 fits, the line gives 6"),
        (1, 0.01, 125, 8, 256, 256, "everything fits: stops at the ceiling"),
        (1, 0.01, 125, 8, 100, 100, "the ceiling is not a power of two"),
        (15, 2.5, 35, 8, 256, 8, "exactly TRAIN_BATCH_SIZE"),
        (15, 2.5, 17.6, 8, 256, 1, "only 1 fits"),
        (15, 2.5, 16, 8, 256, 0, "nothing fits"),
    ],
)
def test_the_search_predicts_from_two_probes_and_confirms(
    base: float, per: float, limit: float, start: int, ceiling: int, want: int, why: str
) -> None:
    found = search_predicted(linear(base, per, limit + 10), start, ceiling, int(limit * GIB))
    assert found.batch == want, (why, found.probes)
    assert len(found.probes) <= 4, (why, found.probes)  # two to draw the line, one to confirm it


def test_a_line_that_misses_still_ends_on_the_largest_size_under_the_limit() -> None:
    """Peak memory that grows faster than the line of the first two probes (fragmentation near the limit)."""

    def probe(size: int) -> Probed:
        peak = int((10 + 1.0 * size + 0.02 * size * size) * GIB)
        return Probed(peak <= 140 * GIB, peak if peak <= 140 * GIB else 0)

    found = search_predicted(probe, 8, 1024, 125 * GIB)
    want = max(b for b in range(1, 1025) if 10 + b + 0.02 * b * b <= 125)
    assert found.batch == want and len(found.probes) <= 6, found.probes
    assert all(size <= found.batch or not ok or peak > 125 * GIB for size, ok, peak in found.probes)


def test_the_probe_runs_real_steps_and_reports_its_peak() -> None:
    sys.path.insert(0, str(HERE))
    from batch_search_ranks import BASE, PER_SEQUENCE, SEQ, largest_under_headroom, tiny_model_on_standin

    model, device = tiny_model_on_standin(19)
    probe = memory_probe(model, SEQ, model.config.vocab_size, torch.device("cpu"), "fp32", 1 << 20, device)
    assert probe(4) == Probed(True, BASE + 4 * PER_SEQUENCE) and probe(20) == Probed(False, 0)
    found = search_predicted(probe, 8, 256, memory_limit(device))
    assert found.batch == largest_under_headroom(19) == 15 and len(found.probes) <= 4, found.probes
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
    sys.path.insert(0, str(HERE))
    from batch_search_ranks import CAPACITY, largest_under_headroom

    assert ranks[0]["batch"] == ranks[1]["batch"] == largest_under_headroom(CAPACITY[1])  # rank 1's is the smaller
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


def test_with_compile_on_the_search_probes_the_compiled_model_and_training_compiles_its_static_graph(
    tmp_path: Path,
) -> None:
    """Issue 42 items 1 and 2, issue 49 item 1: one compile serves every probed size (the batch dimension dynamic,
    also where only the decoder layers are compiled), the forward and backward that run are the compiled ones, after
    the search the peak memory is the training step's, and training at the batch chosen compiles a static graph,
    once."""
    proc = subprocess.run([sys.executable, str(HERE / "compiled_search_peak.py")], cwd=HERE, capture_output=True,
                          env={**base_env(tmp_path), "PYTHONPATH": str(REPO)}, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    sys.path.insert(0, str(HERE))
    from batch_search_ranks import largest_under_headroom

    assert found["batch"] == largest_under_headroom(24) and len(found["probes"]) <= 4, found["probes"]
    assert found["how"].startswith("probed compiled"), found["how"]
    assert found["search_graphs"] and all(found["search_graphs"]), found  # compiled once, dynamic, for every size
    assert found["first_step_graphs"] and not any(found["first_step_graphs"]), found  # training: static graphs
    assert found["second_step_graphs"] == [], found  # ... compiled once
    assert not found["grads_left"]
    assert found["step_peak"] < found["probes_peak"] - (50 << 20)  # the metric is the step's peak, not the probes'


def test_a_run_into_a_new_folder_takes_the_searched_batch_from_the_cache_and_probes_nothing(
    tmp_path: Path, text_file: Path
) -> None:
    """Issue 49 items 2 and 3: the real run's search on a stand-in device (tests/trainer/auto_batch_standin.py)
    probes at most 4 sizes and ends on the largest batch under the headroom; its result is kept beside the compile
    cache, so a second run into another output folder takes it and probes nothing."""
    sys.path.insert(0, str(HERE))
    from batch_search_ranks import largest_under_headroom

    home = tmp_path / "home"
    env = {**base_env(home), "PYTHONPATH": str(REPO), "TRAIN_DATA": str(text_file), "TRAIN_AUTO_BATCH": "1",
           "TRAIN_SEQ_LEN": "32", "TRAIN_MAX_STEPS": "1", "TRAIN_SAVE_STEPS": "100"}  # fmt: skip
    runs = []
    for folder in ("first", "second"):
        proc = subprocess.run([sys.executable, str(HERE / "auto_batch_standin.py"), "40"], cwd=HERE, text=True,
                              env={**env, "TRAIN_OUTPUT_DIR": str(tmp_path / folder)}, capture_output=True,
                              timeout=600)  # fmt: skip
        assert proc.returncode == 0 and json.loads(proc.stdout.strip().splitlines()[-1])["exit"] == 0, proc.stderr
        config = json.loads((tmp_path / folder / "run_config.json").read_text())
        runs.append((proc.stderr, config["decisions"]["batch_size"]))
    (first_log, first), (second_log, second) = runs
    assert 2 <= first_log.count("auto batch: probe at") <= 4, first_log
    assert first["value"] == second["value"] == largest_under_headroom(40), first
    assert "auto batch: probe at" not in second_log and "cached in" in second_log, second_log
    (cached,) = (home / "torch-compile" / "batch-search").glob("*.json")  # beside the compile cache, not the output
    assert str(cached) in second["reason"]


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


def test_a_searched_batch_is_remembered_beside_the_compile_cache_for_the_same_key_only(tmp_path: Path) -> None:
    from trainer.run.batch_search import cached_batch, remember_batch, search_cache_file

    key = {"model": "1b", "seq_len": 2048, "gpu": "NVIDIA H200", "versions": {"torch": "2.11.0"}}
    environ = {"HF_HOME": str(tmp_path / "hf")}
    path = search_cache_file(key, environ)
    assert path.parent == tmp_path / "torch-compile" / "batch-search"  # beside inductor/ and triton/
    assert search_cache_file(key, {"TORCHINDUCTOR_CACHE_DIR": "/cache/inductor"}).parent == Path("/cache/batch-search")
    torchs_own = {**environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tempfile.gettempdir()) / "torchinductor_root")}
    assert search_cache_file(key, torchs_own) == path  # not torch's /tmp default
    assert cached_batch(path, key) is None
    remember_batch(path, key, 29, "probed 8 fits, 16 fits, 32 out of memory")
    assert cached_batch(path, key) == (29, "probed 8 fits, 16 fits, 32 out of memory")
    other = {**key, "versions": {"torch": "2.12.0"}}
    assert search_cache_file(other, environ) != path and cached_batch(path, other) is None
    path.write_text('{"key": ')  # a torn record is no result
    assert cached_batch(path, key) is None
