"""`python -m trainer [train|config|doctor|bench|fetch|export|push|data|generate|eval|diff|reproduce] ...`: the
container's entry into the trainer.

Each command lives with its concern and registers its own argparse parser (`register(commands)` in
trainer/run/command.py, trainer/config/command.py, trainer/doctor/command.py, trainer/bench/command.py,
trainer/fetch.py, trainer/export/command.py, trainer/hub/push.py, trainer/data_command.py,
trainer/diff_command.py, trainer/reproduce_command.py).
Startup stays light: TRAIN_* is parsed and checked before torch is imported, so a user mistake ends in well under
a second with `error: ...` and exit code 2 (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from trainer.errors import EXIT_USER, ConfigError, Interrupted
from trainer.lifetime import die_with_torchrun

COMMAND_MODULES = (
    "trainer.run.command", "trainer.config.command", "trainer.doctor.command", "trainer.bench.command",
    "trainer.fetch", "trainer.export.command", "trainer.hub.push", "trainer.data_command", "trainer.generate.command",
    "trainer.evaluate.command", "trainer.diff_command", "trainer.reproduce_command",
)  # fmt: skip
DEFAULT_COMMAND = "train"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="trainkit's trainer. Without a command it trains.",
        epilog="Configuration is read from TRAIN_* environment variables; `python -m trainer config` lists them all.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    return parser


def quiet_third_party_notices() -> None:
    """bitsandbytes warns at import on every CPU that an optional prebuilt kernel is missing (it falls back)."""
    import logging

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (argparse itself exits 2 on a bad command line)."""
    raw = list(sys.argv[1:] if argv is None else argv)
    quiet_third_party_notices()
    parser = build_parser()
    args = parser.parse_args(raw or [DEFAULT_COMMAND])
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
