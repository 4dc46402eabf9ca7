"""`python -m trainer diff RUN_A RUN_B`: what differs between two runs, side by side.

Compares each folder's provenance.json (image, library versions, GPU, data fingerprints, Hub revisions, chat
template, seed: trainer.provenance) and the settings and decisions of its run_config.json (trainer.config.run_record);
the question after "the new image trains worse". Prints a table of the differences and one summary line naming them;
exit 0. A folder without provenance.json was made by an older trainkit, and a run_config.json that is missing or
cannot be read leaves nothing to compare: exit 2, naming the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainer.config import run_record
from trainer.errors import EXIT_OK
from trainer.provenance import require

# Keys that name the folder itself or only describe the record: they differ between any two runs.
IGNORED = frozenset({"settings.TRAIN_OUTPUT_DIR", "provenance.format"})
UNCOMPARED = (".mtime_ns", ".size")  # a data file's time and size: its sha256 says whether the content differs


def register(parser: argparse.ArgumentParser) -> None:
    """`diff`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Compare two output folders: image, library versions, GPU, data fingerprints, Hub revisions, "
        "chat template, seed (provenance.json) and the TRAIN_* settings and decisions (run_config.json)."
    )
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="an output folder")
    parser.add_argument("run_b", type=Path, metavar="RUN_B", help="another output folder")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    left, right = facts(args.run_a), facts(args.run_b)
    rows = differences(left, right)
    show(rows, args.run_a, args.run_b)
    return EXIT_OK


def facts(folder: Path) -> dict[str, Any]:
    """One run's comparable facts, flattened to dotted keys; ConfigError when it has no provenance or no readable
    record."""
    provenance = require(folder, "run it again with this version to compare it")
    run = run_record.require(folder, "diff")
    flat = flatten({"provenance": provenance})
    flat.update({f"settings.{name}": value for name, value in run.setting_values().items()})
    flat.update({f"decisions.{name}": value for name, value in run.decision_values().items()})
    return {key: value for key, value in flat.items() if key not in IGNORED and not key.endswith(UNCOMPARED)}


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        found: dict[str, Any] = {}
        for key, value in data.items():
            found.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return found
    return {prefix: data}


def differences(left: dict[str, Any], right: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, value in A, value in B) for each key whose values differ; a key one side lacks shows as None."""
    return [(key, left.get(key), right.get(key)) for key in sorted(left.keys() | right.keys())
            if left.get(key) != right.get(key)]  # fmt: skip


def show(rows: list[tuple[str, Any, Any]], run_a: Path, run_b: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    if not rows:
        print(f"{run_a} and {run_b}: no difference in provenance or settings")
        return
    table = Table(title="what differs")
    table.add_column("what", overflow="fold")
    table.add_column(str(run_a), overflow="fold")
    table.add_column(str(run_b), overflow="fold")
    for key, a, b in rows:
        table.add_row(key, _text(a), _text(b))
    Console().print(table)
    print(f"{len(rows)} difference(s): " + ", ".join(key for key, _, _ in rows))
    sys.stdout.flush()


def _text(value: Any) -> str:
    return "(absent)" if value is None else value if isinstance(value, str) else json.dumps(value)
