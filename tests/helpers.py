"""What many test files need, once: a plain-text corpus to train on, and the assertion that a command met a user's
mistake as the project promises (exit 2, the message naming what is wrong, no traceback)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def write_corpus(path: Path, lines: int = 400) -> Path:
    """`lines` numbered lines of plain text at `path`, written whole (a reader in another process sees all or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text("".join(f"Line {i}: a short sentence about training, number {i}.\n" for i in range(lines)))
    staged.rename(path)
    return path


def assert_user_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, no traceback, and each of `needles` in what the user read on stderr."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr[-3000:]}"


def assert_user_error_in_process(argv: list[str], capsys: Any, *needles: str, env: dict[str, str] | None = None,
                                 monkeypatch: Any = None) -> None:  # fmt: skip
    """assert_user_error for `python -m trainer ARGV` run in this process (`env` set through `monkeypatch`): no
    interpreter and torch started for a refusal made before any work. The command's stop-signal handlers and
    logging handlers are not left to pytest. Its output lock (beside an --output or OUT) stays held until pytest ends:
    give a later real command into the same place another one."""
    import logging
    import signal

    from trainer.__main__ import main

    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    logger = logging.getLogger("trainer")
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    handlers, logger.handlers = logger.handlers, []  # its own on this test's stderr, not one an earlier test left
    try:
        code = main(argv)
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)
        logger.handlers = handlers
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in err, f"{needle!r} not in:\n{err[-3000:]}"
