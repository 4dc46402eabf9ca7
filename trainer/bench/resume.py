"""A bench in several calls: the rows an earlier call measured with the same inputs are kept, not measured again.

`results.json` in the bench folder is the record. A later call with the same inputs (model, data, sequence length,
micro-batch, steps, device and versions) keeps its rows that ran, ran out of memory or were skipped, and measures
the rest; different inputs start afresh. So the full table can be made in short calls (`--rows`, `--time-limit`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path

from trainer.bench.report import RowResult
from trainer.bench.runner import OK, OOM, SKIPPED

INPUTS = ("model", "data", "seq_len", "batch_size", "warmup", "steps", "device", "versions")
KEPT = (OK, OOM, SKIPPED)  # an error (a crash, a timeout) is measured again


def inputs_of(meta: dict) -> dict:
    return {key: meta.get(key) for key in INPUTS}


def earlier_rows(work_dir: Path, meta: dict, fresh: bool) -> tuple[list[RowResult], str]:
    """(rows to keep, what the log says about them); the rows' logs of a record not kept are removed."""
    record = work_dir / "results.json"
    try:
        earlier = json.loads(record.read_text())
    except (OSError, ValueError):
        earlier = None
    kept: list[RowResult] = []
    if earlier is None:
        note = "no earlier results: every selected row is measured"
    elif fresh:
        note = "--fresh: earlier results are replaced"
    elif inputs_of(earlier.get("meta", {})) != inputs_of(meta):
        changed = [k for k in INPUTS if earlier.get("meta", {}).get(k) != meta.get(k)]
        note = f"earlier results were measured with another {', '.join(changed)}: they are replaced"
    else:
        names = {f.name for f in fields(RowResult)}
        kept = [RowResult(**{k: v for k, v in row.items() if k in names}) for row in earlier.get("rows", [])
                if row.get("status") in KEPT]  # fmt: skip
        note = f"kept {len(kept)} row(s) measured earlier with the same inputs: {', '.join(r.name for r in kept)}"
    if not kept:
        shutil.rmtree(work_dir / "rows", ignore_errors=True)  # logs of an earlier bench would not match its results
    return kept, note
