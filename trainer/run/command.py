"""`python -m trainer train` (also `python -m trainer` alone): train with the TRAIN_* configuration."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
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
    from trainer.errors import EXIT_CRASH, EXIT_DIVERGED, EXIT_USER, ConfigError, Interrupted, record_outcome

    code = EXIT_CRASH  # what a traceback ends with
    undo_lock: Callable[[], None] = lambda: None  # noqa: E731
    try:
        _decide_threads()  # before torch is imported
        config.apply_process_defaults()  # before torch is imported
        undo_lock = _lock_before_reading()
        inputs = config.load_inputs()
        settings = inputs.settings
        from trainer.run.divergence import retried_after_divergence

        if retried_after_divergence(Path(settings.output_dir), settings):  # before torch loads: restarts end fast
            code = EXIT_DIVERGED
            return code
        from trainer import memory

        cfg = memory.predicted(config.resolve(inputs))  # a GPU run predicted not to fit exits 2 before it loads
        from trainer.library_patches import skip_peft_import
        from trainer.run.train import run

        skip_peft_import(uses_peft=settings.lora)  # after the refusals made before torch; before the Trainer loads

        code = run(cfg)
    except ConfigError:
        code = EXIT_USER
        undo_lock()
        raise
    except Interrupted as exc:  # a stop that could not finish its step (a reward that does not return)
        code = exc.exit_code
        raise
    finally:
        code = record_outcome(code)  # for the launcher: a stop is told from a crash (trainer.launch.supervise)
    return code


def _decide_threads() -> None:
    """The thread count and OpenMP's wait policy (trainer/machine/threads.py: the launcher's decision where it started
    this process) into this process's environment, with the decision's line that the run logs (trainer.run.train)."""
    import os

    from trainer.machine.threads import thread_env

    processes = os.environ.get("LOCAL_WORLD_SIZE", "1")
    os.environ.update(thread_env(os.environ, int(processes) if processes.isdigit() else 1)[0])


def _lock_before_reading() -> Callable[[], None]:
    """The writing process (rank 0) takes TRAIN_OUTPUT_DIR's lock before anything reads the folder (the checks, the
    resume decision, the recorded batch, the divergence record): a second run is refused before it looks at
    checkpoints the first one rotates away. A folder it cannot create is left to the checks, which name it. Returns
    what undoes it for a run refused by a mistake: the lock released, and the lock file and the folder removed where
    this run made them, so that a mistake leaves nothing behind."""
    import os

    from trainer.config import parse_settings
    from trainer.output_lock import LOCK_NAME, acquire_output_lock

    if os.environ.get("RANK", "0") != "0":
        return lambda: None
    out = Path(parse_settings().output_dir)
    new_folder, new_file = not out.exists(), not (out / LOCK_NAME).exists()
    try:
        lock = acquire_output_lock(out)
    except OSError:
        return lambda: None

    def undo() -> None:
        lock.release()
        if new_file:
            with contextlib.suppress(OSError):
                lock.path.unlink()
        if new_folder:
            with contextlib.suppress(OSError):
                out.rmdir()  # only when empty

    return undo
