"""One settings group, one home (docs/architecture.md, "A new TRAIN_* switch"): each module of trainer/config/schema/
has trainer/config/<its stem>.py holding that group's rules as `problems`, `decide` and `arguments`; the registries
(checks.py, decisions.py, training_arguments.py) call them and hold no rule of their own. Read from source and the
schema: no torch."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from trainer.config.groups import AFTER_HUB, HOMES
from trainer.config.schema import GROUPS, TrainSettings

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "trainer" / "config"
SCHEMA_STEMS = sorted(p.stem for p in (CONFIG / "schema").glob("*.py") if p.stem not in ("__init__", "fields"))
REGISTRIES = ("checks.py", "decisions.py", "training_arguments.py")
SIGNATURES = {"problems": ["inputs"], "decide": ["inputs", "hardware", "so_far"],
              "arguments": ["settings", "decisions", "hardware"]}  # fmt: skip


def test_every_schema_group_is_a_group_with_a_home_in_the_registry() -> None:
    assert sorted(GROUPS) == SCHEMA_STEMS
    assert sorted(home.__name__.rsplit(".", 1)[1] for home in HOMES) == SCHEMA_STEMS
    assert all(home in HOMES for home in AFTER_HUB)


@pytest.mark.parametrize("stem", SCHEMA_STEMS)
def test_each_home_has_the_three_functions(stem: str) -> None:
    home = importlib.import_module(f"trainer.config.{stem}")
    for name, parameters in SIGNATURES.items():
        function = getattr(home, name, None)
        assert inspect.isfunction(function) and function.__module__ == home.__name__, f"config/{stem}.py: no {name}"
        assert list(inspect.signature(function).parameters) == parameters, f"config/{stem}.py: {name}'s parameters"


def test_each_setting_is_declared_in_its_groups_schema_module() -> None:
    for name, info in TrainSettings.model_fields.items():
        group = (info.json_schema_extra or {})["group"]  # type: ignore[index]
        source = (CONFIG / "schema" / f"{group}.py").read_text()
        assert re.search(rf"^    {name}: ", source, re.MULTILINE), f"TRAIN_{name.upper()} is not in schema/{group}.py"


@pytest.mark.parametrize("registry", REGISTRIES)
def test_the_registries_define_no_rule(registry: str) -> None:
    """No check or decision function, and no setting read: a rule in a registry would have no group."""
    tree = ast.parse((CONFIG / registry).read_text())
    rules = [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
             and re.fullmatch(r"_\w+_problems|_?decide_\w+", node.name)]  # fmt: skip
    assert rules == []
    fields = set(TrainSettings.model_fields)
    owners = [node.value for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in fields]
    reads = [owner for owner in owners if getattr(owner, "id", getattr(owner, "attr", None)) in ("s", "settings")]
    assert reads == []


def test_the_architecture_doc_gives_the_recipe_the_code_follows() -> None:
    """The recipe for a new setting names the two files and the three functions every home has."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    recipe = text.split("- **A new TRAIN_* switch.**", 1)[1].split("\n- **", 1)[0]
    assert "config/schema/<group>.py" in recipe and "config/<group>.py" in recipe
    assert all(f"`{name}(" in recipe for name in SIGNATURES)
