"""Errors and exit codes shared by every `python -m trainer` command (see docs/architecture.md)."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_USER = 2
# The run finished (final/ is complete and kept) but TRAIN_PUSH_TO_HUB's export or upload failed: push it later with
# `python -m trainer push`. Distinct from 1 so that schedulers do not restart a finished run for it.
EXIT_PUSH_FAILED = 3
# Training diverged (a non-finite loss or gradient norm, TRAIN_ON_NAN): no checkpoint of non-finite weights, no
# final/, nothing pushed; the newest checkpoint is the last finite one. Distinct so that no scheduler retries it
# as a crash (Kubernetes' ExitCode policy fails the job at once on 1-127) and scripts can tell it apart.
EXIT_DIVERGED = 4
# `reproduce` ran and its losses are not the original's (a result, not a crash or a mistake).
EXIT_DIFFERS = 5
EXIT_SIGNAL_BASE = 128


def exit_code_for_signal(signum: int) -> int:
    """128+N: the code a run interrupted by signal N exits with (143 for SIGTERM, 130 for SIGINT)."""
    return EXIT_SIGNAL_BASE + int(signum)


def signal_of_exit_code(code: int) -> int | None:
    """N for an exit code 128+N, else None."""
    return code - EXIT_SIGNAL_BASE if code > EXIT_SIGNAL_BASE else None


EXIT_SIGTERM = exit_code_for_signal(signal.SIGTERM)
EXIT_SIGINT = exit_code_for_signal(signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT in a command that stops where it is (`generate`, `eval`): what it wrote is whole, and it
    exits 128+N (`exit_code`). A KeyboardInterrupt, so code that keeps its output whole on Ctrl-C does on SIGTERM."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return exit_code_for_signal(self.signum)


def raise_on_stop_signals() -> None:
    """From now on SIGTERM and SIGINT raise Interrupted in the main thread (a command, not the training run, whose
    handler only records them: trainer.run.signals)."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)


# The launcher (trainer.launch.supervise) names a folder here; each trainer process writes its exit code into
# FOLDER/<pid> on the way out, so the launcher can tell a clean stop from a crash behind torchrun's own exit code.
OUTCOME_DIR_ENV = "TRAINKIT_OUTCOME_DIR"
# Written into that folder by the launcher when it stops the trainer processes: after a clean stop they exit 0, so
# torchrun does not take the first one to end for a failed worker and restart the group while the others are still
# exiting (its SIGTERM from the launcher can come too late, or be swallowed by its log tailer).
STOP_REQUESTED = "stop-requested"
STOPPED_CODES = (EXIT_SIGTERM, EXIT_SIGINT)  # a stop that wrote its checkpoint


def record_outcome(code: int) -> int:
    """Record this process's exit code for the launcher (nothing when no launcher asked; never fails the exit) and
    return the code to exit with: 0 for a clean stop the launcher asked for, else `code`."""
    import os

    folder = os.environ.get(OUTCOME_DIR_ENV)
    if not folder:
        return code
    try:
        with open(os.path.join(folder, str(os.getpid())), "w") as handle:
            handle.write(str(code))
    except OSError:
        return code
    stop_asked = os.path.exists(os.path.join(folder, STOP_REQUESTED))
    return 0 if stop_asked and code in STOPPED_CODES else code


class ConfigError(Exception):
    """A user mistake (bad TRAIN_* value, missing data, impossible combination...): exit 2, no traceback.

    `problems` holds one line per problem; str() joins them into the message printed after `error: `.
    """

    def __init__(self, *problems: str) -> None:
        self.problems = [p for p in problems if p] or ["invalid configuration"]
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if len(self.problems) == 1:
            return self.problems[0]
        lines = "\n".join(f"  - {p}" for p in self.problems)
        return f"{len(self.problems)} problems with the configuration:\n{lines}"
