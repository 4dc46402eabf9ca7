"""Stage 2: decide every `auto` on this machine (imports torch to probe it) and assemble what Transformers gets."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainer.config.decisions import ALLOC_CONF, ALLOC_CONF_DEFAULT, decide_all
from trainer.config.inputs import Inputs
from trainer.config.memory_fit import check, memory_decision
from trainer.config.methods import method_arguments
from trainer.config.run_config import RunConfig
from trainer.config.schema import TrainSettings
from trainer.config.training_arguments import apply_user_arguments, derived_training_arguments

if TYPE_CHECKING:
    from trainer.machine.hardware import Hardware


def resolve(
    settings: TrainSettings | Inputs,
    hardware: Hardware | None = None,
    environ: Mapping[str, str] | None = None,
    import_heavy: bool = True,
    memory_check: bool = True,
) -> RunConfig:
    """Decide every `auto` for this machine and build TrainingArguments kwargs; ConfigError if it cannot work here.

    Given the `Inputs` the checks used (`load_inputs`), the run reads the same Hub snapshots and data scans; given
    bare settings, they are resolved here.

    `import_heavy=False` skips what needs transformers/torch (TRAIN_ARGS parsing, compile backend listing): for
    unit tests of the decision logic on a described machine. `memory_check=False`: a GPU run predicted not to fit
    (trainer.config.memory_fit) is resolved rather than refused, for `doctor --memory` to report.
    """
    from trainer.machine import hardware as hardware_module

    inputs = settings if isinstance(settings, Inputs) else Inputs(settings)
    hw = hardware or hardware_module.probe()
    environ = os.environ if environ is None else environ
    decisions, ds, alloc_value = decide_all(inputs, hw, environ, import_heavy)
    derived = derived_training_arguments(inputs.settings, hw, decisions, ds) | method_arguments(inputs.settings)
    arguments, args_decision = apply_user_arguments(inputs.settings, derived, parse=import_heavy)
    decisions = dataclasses.replace(decisions, args=args_decision)
    cfg = RunConfig(inputs, hw, decisions, arguments, ds, env={ALLOC_CONF: alloc_value})
    cfg = dataclasses.replace(cfg, decisions=dataclasses.replace(decisions, memory=memory_decision(cfg)))
    if memory_check:
        check(cfg)  # a GPU run predicted not to fit exits 2 here, before any model is loaded
    return cfg


def apply_process_defaults(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Environment the training process needs before torch is imported (the user's value wins)."""
    environ.setdefault(ALLOC_CONF, ALLOC_CONF_DEFAULT)
