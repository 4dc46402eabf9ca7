"""TRAIN_* -> a checked, resolved run configuration. Importing this package never imports torch.

Two stages, so that mistakes are reported before anything heavy is imported:

1. `load_inputs(env)` (parse.py, checks.py): parse TRAIN_* (unknown names, bad values) and run every check that
   needs no torch (impossible combinations, missing libraries, paths, data). Fast: imports pydantic only. The
   `Inputs` it returns (inputs.py) keeps what the checks resolved: the Hub snapshots, the data scans.
2. `resolve(inputs, hardware)` (resolve.py): probe the machine (imports torch), decide every `auto` value with a
   reason (decisions.py), refuse what this hardware cannot do, and build the `TrainingArguments` kwargs
   (training_arguments.py) and the DeepSpeed config (deepspeed.py).

The TRAIN_* schema is the package schema/ (a field-only module per group); `python -m trainer config` is command.py.
"""

from trainer.config.checks import static_problems
from trainer.config.decision import Decision, Decisions
from trainer.config.inputs import Inputs
from trainer.config.parse import load_inputs, load_settings, parse_settings, train_variables
from trainer.config.resolve import apply_process_defaults, resolve
from trainer.config.run_config import RunConfig
from trainer.config.training_arguments import build_training_arguments

__all__ = [
    "Decision", "Decisions", "Inputs", "RunConfig", "apply_process_defaults", "build_training_arguments",
    "load_inputs", "load_settings", "parse_settings", "resolve", "static_problems", "train_variables",
]  # fmt: skip
