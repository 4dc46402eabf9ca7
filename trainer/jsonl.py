"""JSON Lines written by trainkit (metrics.jsonl, samples.jsonl, evals.jsonl): strict lines, appended whole."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def json_line(record: dict[str, Any]) -> str:
    """One strict JSON line: non-finite floats become null."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    return json.dumps(clean, allow_nan=False)


def append_line(path: Path, line: str) -> None:
    """One whole line or nothing: a write cut short (e.g. a full disk) is undone before the error goes on."""
    with open(path, "ab") as fh:
        size = fh.tell()
        try:
            fh.write((line + "\n").encode())
            fh.flush()
        except OSError:
            fh.truncate(size)
            raise
