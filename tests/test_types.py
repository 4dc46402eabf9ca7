"""The type checker over the torch-free core, model/ and the model commands (pyproject.toml's [tool.mypy] files):
tests/run.sh's lint step runs it first; here it is in the edit-test loop (`pytest -m fast`) too, on mypy's warm cache
a second or two."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_no_type_error() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
