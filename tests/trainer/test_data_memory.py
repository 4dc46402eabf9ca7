"""Preparing the data takes memory that does not grow with the corpus: 400 MB of JSONL needs at most 1.2x the peak
resident memory of 50 MB. Each size is prepared by `python -m trainer data` (what a run does, with the defaults) in a
fresh process, which reports its own peak (VmHWM) and that of its largest worker process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def write_corpus(path: Path, megabytes: int) -> None:
    """Numbered records of varied length, written in blocks (flat memory, fast)."""
    written, i = 0, 0
    with open(path, "w", encoding="utf-8") as handle:
        while written < megabytes * 1e6:
            block = "".join(
                json.dumps({"text": f"Record {n}. " + "All work and no play makes a corpus. " * (1 + n % 40), "id": n})
                + "\n"
                for n in range(i, i + 2000)
            )
            handle.write(block)
            written, i = written + len(block), i + 2000


def prepare(tmp: Path, megabytes: int) -> dict:
    data = tmp / f"corpus-{megabytes}mb.jsonl"
    write_corpus(data, megabytes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAIN_")}
    env.update(PYTHONPATH=str(REPO), TRAIN_DATA=str(data), TRAIN_OUTPUT_DIR=str(tmp / f"out-{megabytes}"))
    proc = subprocess.run([sys.executable, "-m", "trainer", "data"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    data.unlink()  # free the disk before the next size
    workers = summary["workers"]
    summary["peak"] = summary["peak_rss_bytes"] + workers * summary["peak_rss_worker_bytes"]
    return summary


def _shown(run: dict) -> str:
    return f"{run['peak'] / MIB:.0f} MiB peak ({run['tokens'] / 1e6:.0f} M tokens, {run['workers']} workers)"


@pytest.mark.slow
def test_peak_memory_of_preparation_is_flat_in_the_corpus_size(tmp_path: Path) -> None:
    small, large = prepare(tmp_path, 50), prepare(tmp_path, 400)
    assert large["tokens"] > 7 * small["tokens"]
    figures = f"50 MB: {_shown(small)}; 400 MB: {_shown(large)}; ratio {large['peak'] / small['peak']:.2f}"
    print(figures)
    assert large["peak"] <= 1.2 * small["peak"], figures
