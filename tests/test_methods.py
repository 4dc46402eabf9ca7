"""trainer/methods.py is the one table of training methods: the schema admits exactly its names, no other module
lists method names, and each family has the run module that builds its trainer (docs/architecture.md, "A new
TRAIN_METHOD")."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from trainer.methods import FAMILIES, METHODS, names

ROOT = Path(__file__).resolve().parents[1]


def test_the_schema_admits_exactly_the_tables_methods_in_its_order() -> None:
    from trainer.config.schema import TrainSettings

    annotation = TrainSettings.model_fields["method"].annotation
    assert typing.get_origin(annotation) is typing.Literal
    assert typing.get_args(annotation) == names()
    assert TrainSettings.model_fields["method"].default == METHODS[0].name == "sft"


def test_method_names_are_listed_in_trainer_methods_py_only() -> None:
    """A tuple, list or set of two or more method names written out anywhere else in trainer/ is a second list (the
    schema's Literal excepted: the test above holds it equal to the table)."""
    known = set(names())
    found = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        if path.name == "methods.py" and path.parent.name == "trainer":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        literals = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)
                    and isinstance(n.value, ast.Name) and n.value.id == "Literal"}  # fmt: skip
        for node in ast.walk(tree):
            if id(node) in literals:
                continue
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1:
                values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if len(values) == len(node.elts) and set(values) <= known:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_every_family_has_its_run_module_with_prepare() -> None:
    """trainer/run/train.py imports trainer.run.FAMILY and calls its prepare(setup) (read from source: no torch)."""
    assert {m.family for m in METHODS} == set(FAMILIES)
    for family in FAMILIES:
        tree = ast.parse((ROOT / "trainer" / "run" / f"{family}.py").read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == "prepare" for n in tree.body), family


def test_every_trl_methods_config_fields_are_read_from_trls_source() -> None:
    """Each row's TRL config file and class name are where the installed TRL keeps them (TRAIN_ARGS' fields)."""
    import pytest

    from trainer.config.method import config_fields

    pytest.importorskip("trl")
    assert names(trl=True) == tuple(m.name for m in METHODS if m.family != "sft")
    assert {name: bool(config_fields(name)) for name in names(trl=True)} == dict.fromkeys(names(trl=True), True)
