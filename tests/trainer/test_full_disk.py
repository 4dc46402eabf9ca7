"""A full disk, on a real small tmpfs as the output folder (trainer.run.disk_space; conftest.py's `small_disk`): real
`python -m trainer` runs.

- a checkpoint save that runs out of space ends with exit 2 naming the folder; the partial staging folder is gone,
  the previous checkpoint is complete and resumable, metrics.jsonl holds only whole lines; the start warned that
  the folder cannot hold two checkpoints;
- the tokenized-data shards running out of space end the same way (exit 2, no traceback).

The tiny preset's checkpoint takes about 38 MiB; the tests need root to mount (the suite runs as root).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import write_corpus
from train_runs import finish, global_step, start, train_env

from trainer.checkpoint_record import COMPLETE_MARKER


@pytest.mark.parametrize("small_disk", ["60m"], indirect=True)
def test_a_checkpoint_that_does_not_fit_exits_2_and_keeps_the_previous_one(small_disk: Path) -> None:
    out = small_disk / "out"
    code, err = finish(start(train_env(out, save_steps=2, max_steps=6)))
    assert code == 2, err[-3000:]
    assert "Traceback" not in err
    assert f"the filesystem holding {out} is full" in err and "saving checkpoint-4" in err
    assert "a save will likely fail for lack of space" in err  # the start-up estimate
    assert not list(out.glob(".tmp-*")) and not (out / "checkpoint-4").exists()
    assert (out / "checkpoint-2" / COMPLETE_MARKER).is_file() and global_step(out / "checkpoint-2") == 2
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]


@pytest.mark.parametrize("small_disk", ["256k"], indirect=True)
def test_data_shards_that_do_not_fit_exit_2(small_disk: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.txt", lines=12000)  # about 700 KB of text, more tokens than fit
    code, err = finish(start(train_env(small_disk / "out", data=corpus)))
    assert code == 2, err[-3000:]
    assert "Traceback" not in err
    assert "is full" in err and "writing the tokenized data cache" in err
    assert not list((small_disk / "out" / ".cache" / "data").glob(".tmp-*"))
