"""Every file the Dockerfile copies from the build context is in it. .dockerignore is an allow-list, and a file left
out of it fails only the build that reaches its COPY (the online-RL canary did, after a 13-minute stand-in build)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.fast


def context_sources(dockerfile: str) -> list[str]:
    """The build-context paths of every COPY/ADD without --from (a line's continuations joined)."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    sources = []
    for line in joined.splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from=") for w in words[1:]) or len(args) < 2:
            continue
        sources.extend(arg.rstrip("/") for arg in args[:-1])
    return sources


def sent(path: str, patterns: list[str]) -> bool:
    """Whether the engine sends `path`: .dockerignore's last matching pattern decides (a `!` pattern includes)."""
    included = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.lstrip("!").rstrip("/").removeprefix("**/")
        parts = [path, *(str(parent) for parent in Path(path).parents if str(parent) != ".")]
        if any(fnmatch.fnmatch(part, body) or (fnmatch.fnmatch(Path(part).name, body) and "**/" in pattern)
               for part in parts):  # fmt: skip
            included = negated
    return included


def test_every_copied_file_reaches_the_build_context() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]  # fmt: skip
    sources = context_sources((ROOT / "Dockerfile").read_text())
    assert "images/verify.py" in sources
    left_out = [s for s in sources if (ROOT / s).exists() and not sent(s, patterns)]
    assert not left_out, f"copied by the Dockerfile but left out of the build context by .dockerignore: {left_out}"
    assert not [s for s in sources if not (ROOT / s).exists()], "the Dockerfile copies a path the tree lacks"
    assert not sent("tests/run.sh", patterns), "the allow-list lets everything in"
