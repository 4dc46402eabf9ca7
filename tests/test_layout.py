"""The layout's rules (docs/architecture.md), checked on the tree: short files, no path hacks, no import circles,
pure-data modules free of the docker SDK and torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
MAX_LINES = 450


def sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if "assets" not in p.parts)


@pytest.mark.parametrize("path", sources("trainer", "scripts"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_file_is_longer_than_450_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_scripts_make_no_sys_path_edits() -> None:
    offenders = [p.name for p in sources("scripts") if "sys.path" in p.read_text()]
    assert offenders == []


def script_imports() -> dict[str, set[str]]:
    """scripts/ module -> the scripts/ modules it imports at run time (lazy imports included, type-only not)."""
    names = {p.stem for p in sources("scripts")}
    graph = {}
    for path in sources("scripts"):
        found = set()
        tree = ast.parse(path.read_text())
        type_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                     and ast.unparse(block.test) == "TYPE_CHECKING" for n in ast.walk(block)}  # fmt: skip
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
        graph[path.stem] = found & names
    return graph


def test_scripts_have_no_import_circle() -> None:
    graph = script_imports()

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(n == target or (n not in seen and reaches(n, target, seen | {n})) for n in graph[start])

    circles = [name for name in graph if reaches(name, name, {name})]
    assert circles == [], f"modules on an import circle: {circles}"


def test_pure_data_modules_import_neither_docker_nor_torch() -> None:
    probe = ("import sys; sys.path.insert(0, 'scripts'); import matrix, driver, errors; "
             "print(sorted(m for m in ('docker', 'torch') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
