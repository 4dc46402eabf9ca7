"""A stop during data preparation is not a failure (trainer.data.cache), with real processes and signals.

SIGTERM to local rank 0 while it tokenizes leaves no `.failed` marker; after a requeue with the same run id, a
waiting rank waits for the new preparation instead of stopping with "could not prepare the data".
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from test_data_cache import REPO, cache_dir, env_for, prepare_data, write_corpus


def test_a_sigterm_during_preparation_leaves_no_failure_for_the_requeued_ranks(tmp_path: Path) -> None:
    write_corpus(tmp_path / "corpus.jsonl", 4)
    env = env_for(tmp_path, tmp_path / "corpus.jsonl")  # the same run id (none) before and after
    first = subprocess.Popen([sys.executable, "-m", "trainer", "train"], cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 300
    while not any(p.stat().st_size > 0 for p in cache_dir(tmp_path).glob(".tmp-*/tokens-*.bin")):
        assert first.poll() is None and time.monotonic() < deadline, "the preparation ended before the signal"
        time.sleep(0.01)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 143, err[-3000:]
    assert not list(cache_dir(tmp_path).glob("*.failed"))

    waiter = prepare_data(env_for(tmp_path, tmp_path / "corpus.jsonl", LOCAL_RANK="1", RANK="1"))
    time.sleep(1)  # the requeued rank 1 is up first: it reads the cache folder before rank 0 starts again
    preparer = prepare_data({**env, "LOCAL_RANK": "0"})
    (_, err1), (_, err0) = waiter.communicate(timeout=300), preparer.communicate(timeout=300)
    assert preparer.returncode == 0, err0[-3000:]
    assert waiter.returncode == 0, err1[-3000:]
    assert "mapped" in err1
