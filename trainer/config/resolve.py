"""Stage 2: decide every `auto` on this machine (imports torch to probe it) and assemble what Transformers gets."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainer.config.decisions import decisions_of
from trainer.config.inputs import Inputs
from trainer.config.run_config import RunConfig
from trainer.config.schedule import with_user_arguments
from trainer.config.schema import TrainSettings
from trainer.config.sharding import ALLOC_CONF, ALLOC_CONF_DEFAULT, deepspeed_config, process_environment
from trainer.config.training_arguments import derived_training_arguments

if TYPE_CHECKING:
    from trainer.machine.hardware import Hardware


def resolve(
    settings: TrainSettings | Inputs,
    hardware: Hardware | None = None,
    environ: Mapping[str, str] | None = None,
    import_heavy: bool = True,
) -> RunConfig:
    """Decide every `auto` for this machine and build TrainingArguments kwargs; ConfigError if it cannot work here.

    Given the `Inputs` the checks used (`load_inputs`), the run reads the same Hub snapshots and data scans; given
    bare settings, they are resolved here.

    `import_heavy=False` skips what needs transformers/torch (TRAIN_ARGS parsing, compile backend listing): for
    unit tests of the decision logic on a described machine. Whether the run fits in GPU memory is the prediction's
    (trainer.memory: `with_prediction`, `check`), which the commands ask after this.
    """
    from trainer.machine import hardware as hardware_module

    inputs = settings if isinstance(settings, Inputs) else Inputs(settings)
    s, hw = inputs.settings, hardware or hardware_module.probe()
    environ = os.environ if environ is None else environ
    decisions = decisions_of(inputs, hw, environ, import_heavy)
    arguments, args_decision = with_user_arguments(s, derived_training_arguments(s, hw, decisions), parse=import_heavy)
    decisions = dataclasses.replace(decisions, args=args_decision)
    ds = deepspeed_config(s, decisions.precision.value, decisions.model.value)
    return RunConfig(inputs, hw, decisions, arguments, ds, env=process_environment(decisions))


def apply_process_defaults(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Environment the training process needs before torch is imported (the user's value wins)."""
    environ.setdefault(ALLOC_CONF, ALLOC_CONF_DEFAULT)
