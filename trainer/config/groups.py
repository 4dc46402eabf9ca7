"""The settings groups' homes: one module of trainer/config/ per module of trainer/config/schema/, with the same stem,
holding that group's rules as three functions: `problems(inputs)` (the checks that need no torch), `decide(inputs,
hardware, so_far)` (its decisions, each with its reason) and `arguments(settings, decisions, hardware)` (its slice of
TrainingArguments, or of the method's TRL config). The registries (checks.py, decisions.py, training_arguments.py) call
them in this order and define no rule of their own (tests/test_settings_homes.py).

The order is the order of the decisions: the method first (the other groups' rules ask which method runs), the paths
(the model folder), the precision before what computes in it, the optimizer's DataLoader before the speed group's
asynchronous copies.
"""

from __future__ import annotations

from types import ModuleType

from trainer.config import (
    adapters,
    debug,
    evaluation,
    launch,
    method,
    moe,
    optim,
    outputs,
    paths,
    precision,
    schedule,
    sharding,
    speed,
)

HOMES: tuple[ModuleType, ...] = (
    method, paths, precision, optim, sharding, speed, adapters, moe, schedule, evaluation, debug, outputs, launch,
)  # fmt: skip
# The groups whose checks read what the Hub fetched (a Hub dataset's records, the template of a Hub tokenizer), asked
# in this order once every other check passed; the first that finds a problem is reported (a later one would read what
# it refused).
AFTER_HUB: tuple[ModuleType, ...] = (method, paths)
