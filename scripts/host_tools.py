"""Whether the host tools are installed, asked before an orchestration script imports any of them.

The orchestration scripts (build.py, run.py, cluster.py, generate.py, matrix.py) import this module first (`# isort:
skip`): importing it checks pyproject.toml's `host` extra (each distribution installed) and the project itself
(`trainer` importable) when the program is one of scripts/; what is missing ends the script in one line naming it and
what to install, exit 2, instead of a traceback from whichever import came first. Standard library only, and no
syntax newer than Python 3.10's.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
INSTALL = "from the repository root run `pip install -e '.[host]'` (scripts/quickstart.sh makes a venv with them)"


def host_requirements() -> list[str]:
    """The distribution names of pyproject.toml's `host` extra."""
    import tomllib

    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["host"]
    return [match.group(0) for match in (re.match(r"[A-Za-z0-9._-]+", entry) for entry in extra) if match]


def missing() -> list[str]:
    """What of the host tools this interpreter lacks (empty: none)."""
    if sys.version_info < (3, 11):
        return [f"Python 3.11 or newer (this is {sys.version.split()[0]})"]
    lacking = []
    for name in host_requirements():
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            lacking.append(name)
    if importlib.util.find_spec("trainer") is None:
        lacking.append("trainkit itself (the `trainer` package)")
    return lacking


def require() -> None:
    """Exit 2 with one line when something is missing."""
    lacking = missing()
    if lacking:
        script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "this script"
        print(f"error: scripts/{script} needs trainkit's host tools, and {sys.executable} lacks "
              f"{', '.join(lacking)}: {INSTALL}, then retry.", file=sys.stderr)  # fmt: skip
        sys.exit(2)


def _run_as_a_script() -> bool:
    """Whether the program is one of scripts/ (not pytest or another program importing a script's module)."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return bool(main) and Path(main).resolve().parent == PYPROJECT.parent / "scripts"


if _run_as_a_script():
    require()
