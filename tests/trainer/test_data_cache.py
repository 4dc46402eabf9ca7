"""The tokenized-data cache under interruption and with several ranks, with real processes and signals.

- SIGKILL in the middle of a preparation leaves no usable entry; the next run removes the half-written folder and
  prepares again from the start, to the same tokens.
- Local rank 0 prepares; another local rank waits for it (or stops with its error, or times out with a message).
- Two torchrun processes (gloo, CPU) train on one prepared cache.
- SIGTERM during a preparation is a stop, not a failure: a requeued job prepares again.
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

from trainer.data import cache
from trainer.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write_corpus(path: Path, megabytes: float) -> int:
    """JSONL of numbered records; returns the byte-level token count (UTF-8 bytes + one EOS per record)."""
    tokens, written, i = 0, 0, 0
    with open(path, "w", encoding="utf-8") as handle:
        while written < megabytes * 1e6:
            texts = [f"Record {n}: the quick brown fox jumps over the lazy dog. " * 8 for n in range(i, i + 5000)]
            block = "".join(json.dumps({"text": t}) + "\n" for t in texts)
            handle.write(block)
            written, i = written + len(block), i + 5000
            tokens += sum(len(t.encode()) + 1 for t in texts)
    return tokens


def env_for(tmp: Path, data: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TRAIN_", "TORCHELASTIC", "LOCAL_RANK"))}
    return {**base, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "TRAIN_DATA": str(data), "TRAIN_OUTPUT_DIR": str(tmp / "out"), "TRAIN_SEQ_LEN": "64", **extra}  # fmt: skip


def prepare_data(env: dict[str, str], **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "trainer", "data"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)  # fmt: skip


def cache_dir(tmp: Path) -> Path:
    return tmp / "out" / ".cache" / "data"


def test_sigkill_mid_preparation_leaves_nothing_used_and_the_next_run_starts_over(tmp_path: Path) -> None:
    tokens = write_corpus(tmp_path / "corpus.jsonl", 150)
    env = env_for(tmp_path, tmp_path / "corpus.jsonl")
    proc = prepare_data(env, start_new_session=True)
    deadline = time.monotonic() + 300
    while not any(p.stat().st_size > 0 for p in cache_dir(tmp_path).glob(".tmp-*/tokens-*.bin")):
        assert proc.poll() is None and time.monotonic() < deadline, "the preparation ended before it could be killed"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the preparation and any workers
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert list(cache_dir(tmp_path).glob("*/meta.json")) == []  # nothing a run would map
    (half,) = cache_dir(tmp_path).glob(".tmp-*")

    again = prepare_data(env)
    stdout, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr[-3000:]
    assert f"removing {half}, left by an interrupted preparation" in stderr
    summary = json.loads(stdout)
    assert summary["tokens"] == tokens and summary["sequences"] == tokens // 64
    assert not list(cache_dir(tmp_path).glob(".tmp-*"))


def test_local_rank_1_waits_for_local_rank_0_and_maps_its_shards(tmp_path: Path) -> None:
    tokens = write_corpus(tmp_path / "corpus.jsonl", 30)
    run = {"TORCHELASTIC_RUN_ID": "test-run"}
    waiter = prepare_data(env_for(tmp_path, tmp_path / "corpus.jsonl", LOCAL_RANK="1", RANK="1", **run))
    time.sleep(1)  # rank 1 is up first: it must wait, not prepare
    preparer = prepare_data(env_for(tmp_path, tmp_path / "corpus.jsonl", LOCAL_RANK="0", RANK="0", **run))
    (out1, err1), (out0, err0) = waiter.communicate(timeout=600), preparer.communicate(timeout=600)
    assert waiter.returncode == 0 and preparer.returncode == 0, err1[-2000:] + err0[-2000:]
    assert "local rank 1 waits for local rank 0" in err1 and "mapped" in err1 and "tokenized" not in err1
    assert "tokenized" in err0
    assert json.loads(out1)["folder"] == json.loads(out0)["folder"]
    (meta,) = cache_dir(tmp_path).glob("*/meta.json")
    assert json.loads(meta.read_text())["prepared_by"]["local_rank"] == 0
    assert json.loads(out1)["tokens"] == tokens


def test_a_waiting_rank_stops_with_the_preparing_ranks_error(tmp_path: Path) -> None:
    lines = [json.dumps({"text": f"record {i}"}) for i in range(100)]
    lines[2] = '{"text": "broken'
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    run = {"TORCHELASTIC_RUN_ID": "test-run", "TRAIN_DATA_MAX_BAD_LINES": "0"}
    waiter = prepare_data(env_for(tmp_path, tmp_path / "bad.jsonl", LOCAL_RANK="1", **run))
    # rank 0 meets the bad line in the reader: the torch-free check of the first line passes (it is line 1)
    preparer = prepare_data(env_for(tmp_path, tmp_path / "bad.jsonl", LOCAL_RANK="0", **run))
    (_, err1), (_, err0) = waiter.communicate(timeout=300), preparer.communicate(timeout=300)
    assert preparer.returncode == 2 and f"{tmp_path / 'bad.jsonl'}:3: not valid JSON" in err0
    assert waiter.returncode == 2, err1[-2000:]
    assert f"error: local rank 0 could not prepare the data: TRAIN_DATA: {tmp_path / 'bad.jsonl'}:3:" in err1


def test_waiting_longer_than_the_timeout_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"waited 1s for local rank 0 to prepare .* see local rank 0's log"):
        cache.wait_for(tmp_path, "somekey", timeout_s=1)


def test_two_torchrun_processes_share_one_prepared_cache(tmp_path: Path) -> None:
    tokens = write_corpus(tmp_path / "corpus.jsonl", 20)
    env = env_for(tmp_path, tmp_path / "corpus.jsonl", TRAIN_NPROC_PER_NODE="2", TRAIN_MAX_STEPS="2",
                  TRAIN_BATCH_SIZE="2", TRAIN_LOG_STEPS="1", TRAIN_MAX_RESTARTS="0")  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "trainer.launch", "train"], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=600, check=False)  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "--nproc-per-node 2" in output and "[rank 0/2]" in output
    assert output.count("data: tokenized") == 1
    (meta,) = cache_dir(tmp_path).glob("*/meta.json")
    written = json.loads(meta.read_text())
    assert written["prepared_by"]["rank"] == 0 and written["tokens"] == tokens
    assert not list(cache_dir(tmp_path).glob(".tmp-*")) and not list(cache_dir(tmp_path).glob("*.failed"))
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()


def test_sigterm_during_preparation_stops_cleanly_and_the_requeued_ranks_prepare_again(tmp_path: Path) -> None:
    """A stop is not a failure: SIGTERM to local rank 0 while it tokenizes leaves nothing half-written and no
    `.failed` marker, so after a requeue with the same run id (none) a waiting rank waits for the new preparation
    instead of stopping with "could not prepare the data"."""
    write_corpus(tmp_path / "corpus.jsonl", 30)
    env = env_for(tmp_path, tmp_path / "corpus.jsonl", TRAIN_MAX_STEPS="1")
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 300
    while not any(p.stat().st_size > 0 for p in cache_dir(tmp_path).glob(".tmp-*/tokens-*.bin")):
        assert proc.poll() is None and time.monotonic() < deadline, "the preparation ended before the signal"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-3000:]
    assert "interrupted by SIGTERM before training started" in stderr and "Traceback" not in stderr
    assert not list(cache_dir(tmp_path).glob(".tmp-*")) and not list(cache_dir(tmp_path).glob("*/meta.json"))
    assert not list(cache_dir(tmp_path).glob("*.failed"))

    waiter = prepare_data(env_for(tmp_path, tmp_path / "corpus.jsonl", LOCAL_RANK="1", RANK="1"))
    time.sleep(1)  # the requeued rank 1 is up first: it reads the cache folder before rank 0 starts again
    preparer = prepare_data({**env, "LOCAL_RANK": "0"})
    (_, err1), (_, err0) = waiter.communicate(timeout=300), preparer.communicate(timeout=300)
    assert preparer.returncode == 0, err0[-3000:]
    assert waiter.returncode == 0, err1[-3000:]
    assert "mapped" in err1


def test_two_separate_data_commands_prepare_once_and_share_the_entry(tmp_path: Path) -> None:
    """Two `python -m trainer data` at once on the same data: the first, held (SIGSTOP) mid-preparation, keeps the
    entry's lock; the second says it waits for it, and once the first goes on, maps its entry: one tokenization, one
    entry, nothing half-written left."""
    from waiting import wait_for

    tokens = write_corpus(tmp_path / "corpus.jsonl", 2)
    env = env_for(tmp_path, tmp_path / "corpus.jsonl")
    first = prepare_data(env, start_new_session=True)
    wait_for(lambda: list(cache_dir(tmp_path).glob(".tmp-*")), 300, "the first's staging folder", interval=0.005,
             proc=first)  # fmt: skip
    os.killpg(first.pid, signal.SIGSTOP)
    log = tmp_path / "second.err"
    try:
        with log.open("w") as sink:
            second = subprocess.Popen([sys.executable, "-m", "trainer", "data"], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=sink)  # fmt: skip
        wait_for(lambda: "another process is preparing" in log.read_text(), 300, "the second to wait", proc=second)
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    (out0, err0), (out1, _) = first.communicate(timeout=600), second.communicate(timeout=600)
    assert first.returncode == 0 and second.returncode == 0, err0[-2000:] + log.read_text()[-2000:]
    assert "tokenized" in err0 and "tokenized" not in log.read_text() and "mapped" in log.read_text()
    assert json.loads(out0)["folder"] == json.loads(out1)["folder"] and json.loads(out1)["tokens"] == tokens
    assert len(list(cache_dir(tmp_path).glob("*/meta.json"))) == 1 and not list(cache_dir(tmp_path).glob(".tmp-*"))
