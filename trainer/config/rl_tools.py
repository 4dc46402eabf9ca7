"""Multi-turn online RL, the method group's part (TRAIN_RL_TOOLS, TRAIN_RL_ENVIRONMENT, TRAIN_RL_MAX_TURNS,
TRAIN_RL_TOOL_TIMEOUT): the values parsed once, checked without running anything, their files' identity (the resume
record, provenance.json) and the GRPOConfig field they set. Torch- and TRL-free: the files are read with `ast` here
(each exists, parses, defines the functions and classes named, each function and method has a docstring and its
arguments type hints, each class a `reset`); trainer/run/tools.py imports them and checks them as TRL will use them
before the model loads, trainer/run/multi_turn.py runs the episodes.

TRAIN_RL_TOOLS=path/a.py:f,g,path/b.py:h names plain functions (a bare name continues the file before it);
TRAIN_RL_ENVIRONMENT=path/env.py:Class gives every record the class's episode (one instance per rollout, its public
methods the tools), or name=path/env.py:Class,... one per record by its `environment` column.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config.schema import TrainSettings
from trainer.provenance import file_sha256

OPTIONS = ("rl_tools", "rl_environment", "rl_max_turns", "rl_tool_timeout")
RESERVED = ("reset", "get_reward")  # an environment's methods TRL does not offer as tools
ENVIRONMENT_COLUMN = "environment"


@dataclass(frozen=True)
class ToolSource:
    """One file of TRAIN_RL_TOOLS with the functions taken from it."""

    path: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class EnvironmentSource:
    """One entry of TRAIN_RL_ENVIRONMENT: a class in a file, under the name records give in `environment` ("" for
    the one environment every record uses)."""

    name: str
    path: str
    cls: str


def tool_sources(value: str) -> list[ToolSource]:
    """TRAIN_RL_TOOLS as its files and their functions."""
    sources: list[ToolSource] = []
    for part in (p.strip() for p in value.split(",") if p.strip()):
        if ".py:" in part:
            path, _, name = part.rpartition(":")
            sources.append(ToolSource(path, (name,)))
        elif sources:
            sources[-1] = ToolSource(sources[-1].path, (*sources[-1].names, part))
        else:
            sources.append(ToolSource("", (part,)))  # no file named: tool_problems says so
    return sources


def environment_sources(value: str) -> list[EnvironmentSource]:
    """TRAIN_RL_ENVIRONMENT as its entries."""
    out = []
    for part in (p.strip() for p in value.split(",") if p.strip()):
        head, _, cls = part.rpartition(":")
        name, _, path = head.rpartition("=") if "=" in head.split(".py")[0] else ("", "", head)
        out.append(EnvironmentSource(name.strip(), path.strip(), cls.strip()))
    return out


def in_use(s: TrainSettings) -> bool:
    return bool(s.rl_tools or s.rl_environment)


def files(value: str) -> list[str]:
    """The files TRAIN_RL_TOOLS or TRAIN_RL_ENVIRONMENT names that exist, each once, in order."""
    named = [t.path for t in tool_sources(value)] + [e.path for e in environment_sources(value)]
    return list(dict.fromkeys(p for p in named if p and Path(p).is_file()))


def identity(value: str) -> str:
    """TRAIN_RL_TOOLS or TRAIN_RL_ENVIRONMENT as a checkpoint records it: each file with its content's sha256, so that
    an edited tool or environment is a changed setting on resume (trainer.config.resume)."""
    found = files(value)
    if not found:
        return value
    return value + " (" + ", ".join(f"{p} sha256 {file_sha256(p)[:16]}" for p in found) + ")"


def file_hashes(s: TrainSettings) -> dict[str, str]:
    """{path: sha256} of every tool and environment file (provenance.json)."""
    return {path: file_sha256(path) for path in dict.fromkeys([*files(s.rl_tools), *files(s.rl_environment)])}


# ---- checks -------------------------------------------------------------------------------------------------------


def tool_problems(s: TrainSettings) -> list[str]:
    """The four settings against each other; each file read with ast (nothing runs)."""
    if not in_use(s):
        given = [f"TRAIN_{n.upper()}" for n in OPTIONS[2:] if n in s.model_fields_set]
        return [f"{', '.join(given)}: for multi-turn runs (TRAIN_RL_TOOLS or TRAIN_RL_ENVIRONMENT); remove "
                f"{'them' if len(given) > 1 else 'it'}, or give the tools"] if given else []  # fmt: skip
    problems = []
    for source in tool_sources(s.rl_tools):
        problems += _tool_file_problems(source)
    environments = environment_sources(s.rl_environment)
    for entry in environments:
        problems += _environment_problems(entry, environments)
    return problems


def record_problems(s: TrainSettings, rows: list[dict[str, Any]], wheres: list[str], chat: bool) -> list[str]:
    """The prompts against the tools: conversations, and with named environments each record's `environment`."""
    if not in_use(s) or not rows:
        return []
    problems = []
    if not chat:
        problems.append("TRAIN_RL_TOOLS/TRAIN_RL_ENVIRONMENT: the model calls tools in chat turns, so the prompts "
                        "must be conversations (`prompt` as a message list, or `messages` ending on a user turn); "
                        "TRAIN_DATA holds text prompts")  # fmt: skip
    named = [e.name for e in environment_sources(s.rl_environment) if e.name]
    return problems + (environment_column_problems(named, rows, wheres) if named else [])


def _tree(path: str, setting: str) -> tuple[ast.Module | None, list[str]]:
    if not path:
        return None, [f"{setting}: name the file too: path/file.py:NAME"]
    if not path.endswith(".py") or not Path(path).is_file():
        return None, [f"{setting}: no such Python file {path}; mount it and give its path in the container"]
    try:
        return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path), []
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        return None, [f"{setting}: {path} does not read as Python ({exc})"]


def _tool_file_problems(source: ToolSource) -> list[str]:
    tree, problems = _tree(source.path, "TRAIN_RL_TOOLS")
    if tree is None:
        return problems
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for name in source.names:
        if name not in functions:
            defined = ", ".join(sorted(n for n in functions if not n.startswith("_"))[:8]) or "none"
            problems.append(f"TRAIN_RL_TOOLS: {source.path} defines no function {name!r} at its top level (its "
                            f"functions: {defined})")  # fmt: skip
        else:
            problems += _described(functions[name], f"TRAIN_RL_TOOLS: the tool {name} in {source.path}", skip=0)
    return problems


def _described(node: ast.FunctionDef | ast.AsyncFunctionDef, who: str, skip: int) -> list[str]:
    """TRL describes a tool to the model from its docstring and its arguments' type hints: both must be there."""
    arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs][skip:]
    bare = [a.arg for a in arguments if a.annotation is None]
    problems = []
    if not ast.get_docstring(node):
        problems.append(f"{who} has no docstring; TRL tells the model what a tool does from its docstring (a summary "
                        "line, then `Args:` with a line per argument)")  # fmt: skip
    if bare:
        problems.append(f"{who}: the argument {bare[0]!r} has no type hint; TRL tells the model each argument's type "
                        "from its hint, and trainkit checks the model's arguments against it")  # fmt: skip
    return problems


def _environment_problems(entry: EnvironmentSource, every: list[EnvironmentSource]) -> list[str]:
    setting = "TRAIN_RL_ENVIRONMENT"
    if len(every) > 1 and not all(e.name for e in every):
        return [f"{setting}: several environments need a name each (name=path/env.py:Class,...), which each "
                f"record's `{ENVIRONMENT_COLUMN}` column chooses"]  # fmt: skip
    if entry.name and not entry.name.isidentifier():
        return [f"{setting}: {entry.name!r} is no environment name; use letters, digits and _"]
    if [e.name for e in every].count(entry.name) > 1:
        return [f"{setting}: the name {entry.name!r} is given twice"]
    tree, problems = _tree(entry.path, setting)
    if tree is None:
        return problems
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    node = classes.get(entry.cls)
    if node is None:
        defined = ", ".join(sorted(classes)[:8]) or "none"
        return [f"{setting}: {entry.path} defines no class {entry.cls!r} at its top level (its classes: {defined})"]
    methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    if "reset" not in methods and not node.bases:
        problems.append(f"{setting}: {entry.cls} in {entry.path} has no `reset` method; TRL calls reset(**record "
                        "columns) to start each episode")  # fmt: skip
    for name, method in methods.items():
        if name not in RESERVED and not name.startswith("_"):
            problems += _described(method, f"{setting}: {entry.cls}.{name} (a tool) in {entry.path}", skip=1)
    return problems


def environment_column_problems(named: list[str], rows: list[dict[str, Any]], wheres: list[str]) -> list[str]:
    """With named environments every record says in `environment` which one it runs in, by a known name."""
    unknown = [(where, row.get(ENVIRONMENT_COLUMN)) for row, where in zip(rows, wheres, strict=True)
               if row.get(ENVIRONMENT_COLUMN) not in named]  # fmt: skip
    if not unknown:
        return []
    where, value = unknown[0]
    what = f"names the environment {value!r}" if value is not None else f"has no `{ENVIRONMENT_COLUMN}`"
    return [f"TRAIN_RL_ENVIRONMENT: the record at {where} {what}, which is none of {', '.join(named)} ({len(unknown)} "
            f"of {len(rows)} records do not name one of them); give each record `{ENVIRONMENT_COLUMN}`: one of "
            "those names"]  # fmt: skip


def arguments(s: TrainSettings) -> dict[str, Any]:
    """GRPOConfig's field: TRL's tool-calling rounds are the assistant turns less the first."""
    return {"max_tool_calling_iterations": s.rl_max_turns - 1} if in_use(s) else {}
