"""Every TrainingArguments field trainkit derives is one the installed Transformers has: a misspelt key is an error,
never silently dropped; only the fields trainer.compat names as dropped by a version are left out (in-process, on the
real installed transformers; the oldest row's stack runs it with `.venv-oldest`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer import compat, config, transformers_names
from trainer.config.training_arguments import UnknownTrainingArgument, known_arguments
from trainer.machine.hardware import Hardware

CPU = Hardware(device="cpu", cxx_compiler="g++")  # a described machine: the decisions run without probing
SWITCHES = ({}, {"TRAIN_GRAD_CKPT": "1"}, {"TRAIN_EVAL_SPLIT": "0.1", "TRAIN_KEEP_BEST": "1"}, {"TRAIN_COMPILE": "1"})


def test_a_misspelt_key_is_an_error_naming_it() -> None:
    fields = transformers_names.training_argument_fields()
    assert fields, "transformers is installed here"
    with pytest.raises(UnknownTrainingArgument, match="learnig_rate"):
        known_arguments({"learning_rate": 1e-4, "learnig_rate": 1e-4}, fields)


@pytest.mark.parametrize("env", SWITCHES, ids=lambda env: ",".join(env) or "defaults")
def test_every_derived_key_is_a_field_of_the_installed_transformers(tmp_path: Path, env: dict[str, str]) -> None:
    settings = config.parse_settings({"TRAIN_OUTPUT_DIR": str(tmp_path), **env})
    derived = config.resolve(settings, CPU, {}, import_heavy=False).training_arguments
    fields = transformers_names.training_argument_fields()
    assert set(derived) <= fields
    assert not set(derived) & compat.stack().dropped_training_arguments
    assert ("save_safetensors" in derived) == ("save_safetensors" in fields)  # passed wherever the version has it
