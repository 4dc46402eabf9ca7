"""The layout's rules (docs/architecture.md), checked on the tree: short files, no path hacks, no import circles,
no more than three imports up a floor, pure-data modules free of the docker SDK and torch."""

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


def test_scripts_and_benchmarks_make_no_sys_path_edits() -> None:
    offenders = [p.name for p in sources("scripts", "benchmarks") if "sys.path" in p.read_text()]
    assert offenders == []


# The floors of the tree, lowest first: a module may import its own floor and those below it, never one above. Each
# entry is a room: a package or module directly under trainer/, or a whole folder of host code.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("trainer/errors", "trainer/secrets", "trainer/envfile", "trainer/compat", "trainer/transformers_names",
     "trainer/machine", "trainer/checkpoint_record"),  # the machine, the installed versions, a checkpoint's record
    ("trainer/hub",),  # the Hub, torch-free
    ("trainer/data", "trainer/tokenizer"),
    ("trainer/config", "trainer/trackers"),  # TRAIN_* -> RunConfig; the trackers it names and their callbacks
    ("trainer/run", "trainer/export"),  # the training run; export (and the push at a run's end) reads its outputs
    ("trainer/launch", "trainer/doctor", "trainer/bench", "trainer/fetch", "trainer/data_command", "trainer/__main__",
     "trainer/__init__", "trainer/generate", "trainer/evaluate"),
    ("scripts", "benchmarks"),  # the host
)  # fmt: skip
# The imports that run up a floor, on purpose: the checks (config) and the Hub pins (hub) ask trainer.run.resume, the
# one home of resume; the Hub's dataset snapshots take the data file names from trainer.data.formats.
MAX_UPWARD = 3
# A command that reads the configuration lives on a floor above it (trainer/fetch.py, trainer/data_command.py).
NOT_COUNTED: set[str] = set()


def modules() -> dict[str, Path]:
    """Import name -> file, for trainer/ (dotted) and scripts/, benchmarks/ (their files import each other by stem)."""
    found = {}
    for path in sources("trainer"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sources("scripts", "benchmarks"):
        found[path.stem] = path
    return found


def imported_names(path: Path, known: dict[str, Path]) -> set[str]:
    """Every module `path` imports: at module level, inside functions and under TYPE_CHECKING alike (a reader sees
    them all); `from a import b` names a.b when b is a module, else a."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            inner = {f"{node.module}.{alias.name}" for alias in node.names}
            names |= (inner & set(known)) or {node.module}
            if inner - set(known):
                names.add(node.module)
    return names


def import_graph() -> dict[Path, set[Path]]:
    """file -> the files of this tree it imports."""
    known = modules()
    graph: dict[Path, set[Path]] = {}
    for path in known.values():
        targets = set()
        for name in imported_names(path, known):
            while name and name not in known:
                name = name.rpartition(".")[0]  # a name inside a module: the module
            if name and known[name] != path and not (path.name == "__init__.py" and known[name].parent == path.parent):
                targets.add(known[name])
        graph[path] = targets
    return graph


def room(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return "/".join(parts[:2]) if parts[0] == "trainer" else parts[0]


def floor_of(path: Path) -> int:
    for level, rooms in enumerate(FLOORS):
        if room(path) in rooms:
            return level
    raise AssertionError(f"{room(path)} is on no floor: add it to FLOORS here and to docs/architecture.md's tree")


def test_no_import_circle_in_trainer_scripts_or_benchmarks() -> None:
    graph = import_graph()
    circles = []
    for start in graph:
        stack, seen = [(start, [start])], {start}
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join(str(p.relative_to(ROOT)) for p in [*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert circles == [], "import circles:\n" + "\n".join(sorted(circles))


def upward_imports() -> list[str]:
    graph = import_graph()
    return sorted(f"{a.relative_to(ROOT)} -> {b.relative_to(ROOT)}" for a in graph for b in graph[a]
                  if floor_of(b) > floor_of(a) and str(a.relative_to(ROOT)) not in NOT_COUNTED)  # fmt: skip


def test_at_most_three_imports_run_up_a_floor() -> None:
    found = upward_imports()
    assert len(found) <= MAX_UPWARD, f"{len(found)} imports run up a floor:\n" + "\n".join(found)


def test_pure_data_modules_import_neither_docker_nor_torch() -> None:
    probe = ("import sys; sys.path.insert(0, 'scripts'); import matrix, driver, errors; "
             "print(sorted(m for m in ('docker', 'torch') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
