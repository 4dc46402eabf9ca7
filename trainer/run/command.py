"""`python -m trainer train` (also `python -m trainer` alone): train with the TRAIN_* configuration."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    """`train`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Train with the TRAIN_* configuration; `python -m trainer config` lists every variable. "
        "Exit codes: 0 finished, 1 crashed, 2 configuration mistake, 3 finished but the push failed, 4 diverged "
        "(TRAIN_ON_NAN), 128+N stopped by signal N after a checkpoint."
    )
    parser.set_defaults(func=main)


def main(_args: argparse.Namespace) -> int:
    from trainer import config
    from trainer.errors import EXIT_CRASH, EXIT_DIVERGED, EXIT_USER, ConfigError, record_outcome

    code = EXIT_CRASH  # what a traceback ends with
    try:
        config.apply_process_defaults()  # before torch is imported
        inputs = config.load_inputs()
        settings = inputs.settings
        from trainer.run.divergence import retried_after_divergence

        if retried_after_divergence(Path(settings.output_dir), settings):  # before torch loads: restarts end fast
            code = EXIT_DIVERGED
            return code
        cfg = config.resolve(inputs)
        from trainer.run.train import run

        code = run(cfg)
    except ConfigError:
        code = EXIT_USER
        raise
    finally:
        code = record_outcome(code)  # for the launcher: a stop is told from a crash (trainer.launch.supervise)
    return code
