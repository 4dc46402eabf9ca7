"""The layout's rules (docs/architecture.md), checked on the tree: short files, no path hacks, no import circles,
drawn with folders as units no more than three imports up a floor and no circle among the rooms of a floor,
pure-data modules free of the docker SDK and torch."""

from __future__ import annotations

import ast
import re
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


# The floors of the tree, lowest first, drawn with folders as units: each room is a package or module directly under
# trainer/, scripts/ or benchmarks/ ("scripts" and "benchmarks" stand for every room in them). A room may import its
# own floor and those below, never one above; rooms on one floor never import each other in a circle (drawn, one of
# those imports would run back up).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("trainer/errors", "trainer/secrets", "trainer/envfile", "trainer/compat", "trainer/library_patches",
     "trainer/transformers_names", "trainer/checkpoint_record", "trainer/machine", "trainer/provenance",
     "trainer/lifetime", "trainer/logs", "trainer/commands", "trainer/methods", "trainer/jsonl",
     "trainer/output_lock",
     "trainer/vllm_compat"),  # facts of the machine, the installed versions, a checkpoint's record and a run's
    # provenance, how long a process lives, where it logs, the lists of commands and of training methods, how JSON
    # lines are appended and who holds an output folder:
    # no trainkit code above them
    ("trainer/hub",),  # the Hub, torch-free
    ("trainer/tokenizer",),  # the tokenizers the data is encoded with
    ("trainer/data",),
    ("trainer/config", "trainer/trackers"),  # TRAIN_* -> RunConfig; the trackers it names and their callbacks
    ("trainer/model", "trainer/memory"),  # a model built or loaded: preset, folder, checkpoint, export; quantization,
    # LoRA, attention; the memory prediction: a model of a resolved run (it reads a RunConfig)
    ("trainer/export", "trainer/answers"),  # a run's outputs -> a model folder (the run calls it at its end for
    # TRAIN_PUSH_TO_HUB); prompts in, answers out (the run's TRAIN_EVAL_GENERATE samples, generate, eval)
    ("trainer/run",),  # the training run
    ("trainer/launch", "trainer/doctor", "trainer/bench", "trainer/config_command", "trainer/fetch_command",
     "trainer/push_command",
     "trainer/data_command", "trainer/diff_command", "trainer/reproduce_command", "trainer/__main__",
     "trainer/__init__", "trainer/generate", "trainer/evaluate", "trainer/serve", "trainer/check"),
    # the commands: a command that reads the configuration lives above config/
    ("scripts", "benchmarks"),  # the host
)  # fmt: skip


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
    """trainer/X, scripts/X or benchmarks/X: the top-level package or module `path` belongs to."""
    return "/".join(path.relative_to(ROOT).with_suffix("").parts[:2])


def floor_of(path: Path) -> int:
    name = room(path)
    for level, rooms in enumerate(FLOORS):
        if name in rooms or name.split("/")[0] in rooms:
            return level
    raise AssertionError(f"{name} is on no floor: add it to FLOORS here and to docs/architecture.md's floors")


def between_rooms() -> list[tuple[Path, Path]]:
    """Every import from one room into another, once per importing module and imported module."""
    graph = import_graph()
    return sorted((a, b) for a in graph for b in graph[a] if room(a) != room(b))


def describe(edge: tuple[Path, Path]) -> str:
    a, b = edge
    return (f"{a.relative_to(ROOT)} -> {b.relative_to(ROOT)} "
            f"({room(a)}, floor {floor_of(a) + 1} -> {room(b)}, floor {floor_of(b) + 1})")  # fmt: skip


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


def upward_imports() -> list[tuple[Path, Path]]:
    return [(a, b) for a, b in between_rooms() if floor_of(b) > floor_of(a)]


def test_no_import_runs_up_a_floor() -> None:
    found = upward_imports()
    assert found == [], f"{len(found)} imports run up a floor:\n" + "\n".join(map(describe, found))


def test_rooms_on_one_floor_import_each_other_one_way_only() -> None:
    """Drawn with folders as units, rooms on one floor that import each other in a circle need an import back up."""
    level: dict[str, set[str]] = {}
    for a, b in between_rooms():
        if floor_of(a) == floor_of(b):
            level.setdefault(room(a), set()).add(room(b))
    circles = []
    for start in level:
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in level.get(node, ()):
                if nxt == start:
                    circles.append(" -> ".join([*trail, start]))
                elif nxt not in trail:
                    stack.append((nxt, [*trail, nxt]))
    in_circles = {name for circle in circles for name in circle.split(" -> ")}
    through = [describe(e) for e in between_rooms() if floor_of(e[0]) == floor_of(e[1]) and {room(e[0]), room(e[1])}
               <= in_circles]  # fmt: skip
    assert circles == [], "rooms on one floor in a circle:\n" + "\n".join([*circles, "through:", *through])


def test_the_architecture_doc_puts_every_room_on_its_floor() -> None:
    """docs/architecture.md's numbered floors name each room of the tree (`errors`, `hub/`, `diff_command.py`,
    `scripts/`)."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("### Floors", 1)[1].split("###", 1)[0]
    drawn = {}
    for level, line in enumerate(re.findall(r"^\d+\. (.*)$", text, re.MULTILINE)):
        for name in re.findall(r"`([^`]+)`", line):
            stem = name.removesuffix("/").removesuffix(".py")
            drawn[stem if stem in ("scripts", "benchmarks") else f"trainer/{stem}"] = level
    rooms = {room(path) for path in modules().values()} - {"trainer/__init__"}
    placed = {name: drawn.get(name if name.startswith("trainer/") else name.split("/")[0]) for name in rooms}
    assert {name: level for name, level in placed.items() if level != floor_of(ROOT / f"{name}.py")} == {}


def test_pure_data_modules_import_neither_docker_nor_torch() -> None:
    probe = ("import sys; sys.path.insert(0, 'scripts'); import matrix, driver, errors; "
             "print(sorted(m for m in ('docker', 'torch') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def defined_names(path: Path) -> set[str]:
    """What a module defines at its top level (functions, classes, assignments, its own imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":  # names made on first use
            names |= {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
            names |= defined_names_in(node)
    return names


def defined_names_in(node: ast.AST) -> set[str]:
    found: set[str] = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Import | ast.ImportFrom):
            found |= {(alias.asname or alias.name).split(".")[0] for alias in inner.names}
        elif isinstance(inner, ast.FunctionDef | ast.ClassDef):
            found.add(inner.name)
        elif isinstance(inner, ast.Assign):
            found |= {n.id for t in inner.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return found


def test_every_name_imported_from_trainer_exists() -> None:
    """`from trainer.x import name` names what trainer/x defines (a moved name fails here, not in a late run)."""
    known = modules()
    missing = []
    for path in known.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known):
                continue
            defined = defined_names(known[node.module])
            missing += [f"{path.relative_to(ROOT)}: {node.module}.{alias.name}" for alias in node.names
                        if alias.name not in defined and f"{node.module}.{alias.name}" not in known]  # fmt: skip
    assert not missing, "imported but not defined there:\n" + "\n".join(missing)


SCHEMA = ROOT / "trainer" / "config" / "schema"
SCHEMA_MAX_LINES = 200


@pytest.mark.parametrize("path", sorted(SCHEMA.glob("*.py")), ids=lambda p: p.name)
def test_each_settings_group_is_one_short_field_only_module(path: Path) -> None:
    """config/schema/ holds a module per settings group, each at most 200 lines, and each field declares the group
    of the module it is declared in (a setting is found where the docs list it)."""
    assert len(path.read_text().splitlines()) <= SCHEMA_MAX_LINES
    from trainer.config.schema import GROUPS, TrainSettings

    module = f"trainer.config.schema.{path.stem}"
    groups = {
        info.json_schema_extra["group"]
        for cls in TrainSettings.__mro__[1:] if cls.__module__ == module
        for info in cls.model_fields.values()
    }  # fmt: skip
    assert len(groups) <= 1 and groups <= set(GROUPS), f"{path.name} declares settings of the groups {groups}"
