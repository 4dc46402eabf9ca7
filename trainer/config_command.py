"""`python -m trainer config [--json]`: the resolved configuration, without training."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from trainer.errors import EXIT_OK


def register(parser: argparse.ArgumentParser) -> None:
    """`config`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "The resolved configuration: settings (with their source), decisions with their reasons, "
        "Transformers' TrainingArguments and the DeepSpeed config. Secrets are masked."
    )
    parser.add_argument("--json", action="store_true", help="print it as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from trainer import config, library_patches, memory
    from trainer.config import run_record

    cfg = memory.predicted(config.resolve(config.load_inputs()))  # its refusals come before torch is imported
    library_patches.skip_peft_import(uses_peft=False)  # no model here: TrainingArguments needs no PEFT to check
    config.build_training_arguments(cfg)  # Transformers' own validation: what it refuses is exit 2 here too
    record = run_record.started(cfg).to_dict()  # what the run would record in run_config.json, secrets masked
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print_config(record)
    return EXIT_OK


def _table(title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def print_config(data: dict) -> None:
    """The resolved configuration as rich tables: settings (with their source), decisions, the Hub commits,
    Transformers, DeepSpeed."""
    from rich.console import Console

    console = Console()
    settings = [(name, _text(v["value"]), v["source"]) for name, v in data["settings"].items()]
    console.print(_table("Settings (TRAIN_*)", ("variable", "value", "source"), settings))
    decisions = [(name, _text(d["value"]), d["reason"]) for name, d in data["decisions"].items()]
    console.print(_table("Decisions", ("what", "value", "why"), decisions))
    if data.get("hub"):
        hub = [(key, e["repo_id"], e["revision"], e["sha"]) for key, e in data["hub"].items()]
        console.print(_table("Hugging Face Hub (HF_HOME cache)", ("what", "repository", "revision", "commit"), hub))
    arguments = [(k, _text(v)) for k, v in data["training_arguments"].items() if k != "deepspeed"]
    console.print(_table("TrainingArguments", ("argument", "value"), arguments))
    if data["deepspeed"]:
        console.print("[bold]DeepSpeed config[/bold]")
        console.print_json(json.dumps(data["deepspeed"]))
