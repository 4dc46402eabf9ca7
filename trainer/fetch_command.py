"""`python -m trainer fetch`: download what the TRAIN_* configuration names on the Hub into HF_HOME's cache.

Run it where the Hub can be reached (`docker compose run --rm fetch`, `python scripts/run.py fetch`); it prints the
commits, the cache folder to copy or mount on an air-gapped cluster, and the settings to use there. With
HF_HUB_OFFLINE=1 it downloads nothing and checks that the cache holds everything (exit 2 naming what is missing).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from trainer.errors import EXIT_OK, ConfigError

PINNABLE = ("TRAIN_MODEL", "TRAIN_TOKENIZER")  # org/name@sha works for these (datasets: hf://datasets/org/name@sha)


def register(parser: argparse.ArgumentParser) -> None:
    """`fetch`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Download every Hub ID in the TRAIN_* configuration (TRAIN_MODEL, TRAIN_TOKENIZER, TRAIN_DATA, "
        "TRAIN_EVAL_DATA), and with --tasks the datasets of lm-eval-harness tasks, into HF_HOME, then print what to "
        "copy or mount where runs are offline. With HF_HUB_OFFLINE=1: check that the cache holds them all."
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--tasks", metavar="T1,T2", help="also the datasets of these lm-eval-harness tasks (for "
                        "`python -m trainer eval --tasks` offline)")  # fmt: skip
    parser.add_argument("--include-path", metavar="DIR", help="--tasks: a folder of your own lm-eval task YAML files")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from trainer.config import Inputs, parse_settings
    from trainer.hub.download import cache_dir, offline

    sources = Inputs(parse_settings()).hub
    if sources.problems:
        raise ConfigError(*sources.problems)
    entries = {
        name: {**snap.record(), "path": str(snap.path), "bytes": _size(snap.path)}
        for name, snap in sources.snapshots().items()
    }
    report = {"offline_check": offline(), "cache": cache_dir(), "fetched": entries}
    if args.tasks:
        from trainer.evaluate.harness import load_tasks, split_tasks

        report["tasks"] = load_tasks(split_tasks(args.tasks), args.include_path, fetching=not offline()).names
    print(json.dumps(report, indent=2) if args.json else _text(report))
    return EXIT_OK


def _size(folder: Path) -> int:
    """Bytes of the snapshot's files (the blobs its links point to)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _text(report: dict[str, Any]) -> str:
    fetched = report["fetched"]
    tasks = report.get("tasks")
    if tasks:
        verb = "in the cache" if report["offline_check"] else "fetched"
        where = os.environ.get("HF_DATASETS_CACHE") or os.path.join(os.environ.get("HF_HOME", "~/.cache/huggingface"),
                                                                    "datasets")  # fmt: skip
        note = f"lm-eval tasks {verb}: {', '.join(tasks)} (their datasets in {where})"
        return note if not fetched else note + "\n" + _text({**report, "tasks": None})
    if not fetched:
        return ("nothing to fetch: no TRAIN_MODEL, TRAIN_TOKENIZER, TRAIN_DATA or TRAIN_EVAL_DATA names the Hub "
                "(presets, local folders and files need no download)")  # fmt: skip
    verb = "in the cache" if report["offline_check"] else "fetched"
    lines = [f"{verb}: {name}={entry['repo_id']}@{entry['revision']} -> commit {entry['sha']} "
             f"({entry['bytes'] / 1e6:.1f} MB)" for name, entry in fetched.items()]  # fmt: skip
    hf_home = os.environ.get("HF_HOME", str(Path(report["cache"]).parent))
    lines += [
        "",
        f"cache: {report['cache']}",
        "For an air-gapped machine: copy or mount this cache there as HF_HOME/hub (in the image HF_HOME is "
        f"/cache/huggingface, kept in compose's `cache` volume; here HF_HOME={hf_home}), and run with "
        "HF_HUB_OFFLINE=1 and the same settings; or pin the commits:",
        *(f"  {name}={entry['repo_id']}@{entry['sha']}" for name, entry in fetched.items() if name in PINNABLE),
        "`python -m trainer fetch` with HF_HUB_OFFLINE=1 there checks that everything is in place.",
    ]
    return "\n".join(lines)
