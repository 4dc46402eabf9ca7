"""What many test files need, once: a plain-text corpus to train on, and the assertion that a command met a user's
mistake as the project promises (exit 2, the message naming what is wrong, no traceback)."""

from __future__ import annotations

import subprocess
from pathlib import Path


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
