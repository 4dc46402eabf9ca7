"""`python -m trainer [COMMAND] ...`: the container's entry into the trainer.

The commands are trainer/commands.py's list (name, one line of help, the module that adds its arguments); each
module's `register(parser)` fills in the parser made here for it. Startup stays light: TRAIN_* is parsed and checked
before torch is imported, so a user mistake ends in well under a second with `error: ...` and exit code 2
(docs/architecture.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from trainer.commands import COMMANDS, DEFAULT
from trainer.errors import EXIT_USER, ConfigError, Interrupted
from trainer.lifetime import die_with_torchrun

# Nothing phones home unless the user asks: the usage pings of the libraries the image carries are off by default
# (a value the user set wins). HF_HUB_DISABLE_TELEMETRY covers huggingface_hub, Transformers, datasets and TRL's
# trainer pings; MLflow 3 has its own; W&B's error reports (Sentry) go out even for an offline run. The Dockerfile
# sets the same (tests/trainer/test_no_phone_home.py keeps the two equal).
NO_TELEMETRY = {"HF_HUB_DISABLE_TELEMETRY": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "WANDB_ERROR_REPORTING": "false",
                "DO_NOT_TRACK": "1"}  # fmt: skip


def no_telemetry() -> None:
    """NO_TELEMETRY's defaults into this process's environment (and its children's), before any library reads it."""
    for name, value in NO_TELEMETRY.items():
        os.environ.setdefault(name, value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="trainkit's trainer. Without a command it trains.",
        epilog="Configuration is read from TRAIN_* environment variables; `python -m trainer config` lists them all.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        importlib.import_module(command.module).register(commands.add_parser(command.name, help=command.help))
    return parser


def quiet_third_party_notices() -> None:
    """bitsandbytes warns at import on every CPU that an optional prebuilt kernel is missing (it falls back)."""
    import logging

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (argparse itself exits 2 on a bad command line)."""
    raw = list(sys.argv[1:] if argv is None else argv)
    no_telemetry()
    quiet_third_party_notices()
    parser = build_parser()
    args = parser.parse_args(raw or [DEFAULT])
    args.argv = raw[1:]  # the command's own arguments, as typed (bench records them)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_USER
    except Interrupted as exc:  # a command that raises on stop signals (generate, eval), before it wrote anything
        print(f"interrupted by {exc}; exit {exc.exit_code}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # the reader went away (`bench --list | head`): stop quietly, as `ls | head` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 1


if __name__ == "__main__":
    die_with_torchrun()
    sys.exit(main())
