"""`python -m trainer [train|config|doctor|bench] ...`: the container's entry into the trainer.

Startup stays light: TRAIN_* is parsed and checked before torch is imported, so a user mistake ends in well under
a second with `error: ...` and exit code 2 (docs/architecture.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from trainer.errors import EXIT_OK, EXIT_USER, ConfigError

USAGE = """usage: python -m trainer [COMMAND] [ARGS]

commands:
  train            train with the TRAIN_* configuration (the default)
  config [--json]  print the resolved configuration without training
  doctor [--json]  what this machine can do, and whether the configured run can work here
  bench [...]      measure techniques side by side (python -m trainer bench --help)

Configuration is read from TRAIN_* environment variables; `python -m trainer config` lists them all."""


def train_command(argv: list[str]) -> int:
    if argv:
        raise ConfigError(f"`train` takes no arguments (got {' '.join(argv)}); configure it with TRAIN_* variables")
    from trainer import config

    config.apply_process_defaults()  # before torch is imported
    cfg = config.resolve(config.load_settings())
    from trainer.train import run

    return run(cfg)


def config_command(argv: list[str]) -> int:
    unknown = [a for a in argv if a != "--json"]
    if unknown:
        raise ConfigError(f"config: unknown argument {unknown[0]!r}; usage: python -m trainer config [--json]")
    from trainer import config

    settings = config.load_settings()
    cfg = config.resolve(settings)
    config.build_training_arguments(cfg)  # Transformers' own validation: what it refuses is exit 2 here too
    if "--json" in argv:
        print(json.dumps(cfg.to_dict(masked=True), indent=2))
    else:
        print_config(cfg.to_dict(masked=True))
    return EXIT_OK


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]):
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
    """The resolved configuration as rich tables: settings (with their source), decisions, Transformers, DeepSpeed."""
    from rich.console import Console

    console = Console()
    settings = [(name, _text(v["value"]), v["source"]) for name, v in data["settings"].items()]
    console.print(_table("Settings (TRAIN_*)", ("variable", "value", "source"), settings))
    decisions = [(name, _text(d["value"]), d["reason"]) for name, d in data["decisions"].items()]
    console.print(_table("Decisions", ("what", "value", "why"), decisions))
    arguments = [(k, _text(v)) for k, v in data["training_arguments"].items() if k != "deepspeed"]
    console.print(_table("TrainingArguments", ("argument", "value"), arguments))
    if data["deepspeed"]:
        console.print("[bold]DeepSpeed config[/bold]")
        console.print_json(json.dumps(data["deepspeed"]))


def doctor_command(argv: list[str]) -> int:
    from trainer.doctor import main

    return main(argv)


def bench_command(argv: list[str]) -> int:
    from trainer.bench import main

    return main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": train_command,
    "config": config_command,
    "doctor": doctor_command,
    "bench": bench_command,
}


def quiet_third_party_notices() -> None:
    """bitsandbytes warns at import on every CPU that an optional prebuilt kernel is missing (it falls back)."""
    import logging

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    quiet_third_party_notices()
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return EXIT_OK
    command, rest = (args[0], args[1:]) if args else ("train", [])
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return EXIT_USER
    try:
        return COMMANDS[command](rest)
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_USER


if __name__ == "__main__":
    sys.exit(main())
