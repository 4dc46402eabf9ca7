"""Transformers' `TrainingArguments` kwargs (a method on TRL's trainers: its TRL config's): each settings group's
slice (trainer/config/groups.py), then TRAIN_ARGS on top (trainer/config/schedule.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trainer import compat, library_patches, transformers_names
from trainer.config import method
from trainer.config.decision import Decisions
from trainer.config.groups import HOMES
from trainer.config.schema import TrainSettings
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.config.run_config import RunConfig
    from trainer.machine.hardware import Hardware

log = logging.getLogger("trainer")


def derived_training_arguments(s: TrainSettings, hw: Hardware, decisions: Decisions) -> dict[str, Any]:
    """TrainingArguments (or the method's TRL config) kwargs from TRAIN_* and the decisions, before TRAIN_ARGS: each
    group's slice; two groups never set the same field."""
    args: dict[str, Any] = {}
    for home in HOMES:
        part = home.arguments(s, decisions, hw)
        twice = sorted(set(args) & set(part))
        if twice:
            raise DoubleArgument(f"{', '.join(twice)} set by two settings groups (the second: {home.__name__}); "
                                 "one group owns each field")  # fmt: skip
        args |= part
    return known_arguments(args, transformers_names.training_argument_fields(), method.trl_fields(s))


class DoubleArgument(ValueError):
    """Two settings groups derived the same field: a bug, not a user's mistake (exit 1 with the traceback)."""


class UnknownTrainingArgument(ValueError):
    """trainkit derived a TrainingArguments field the installed Transformers does not have: a bug, not a user's
    mistake (exit 1 with the traceback)."""


def known_arguments(args: dict[str, Any], fields: frozenset[str], trl: frozenset[str] = frozenset()) -> dict[str, Any]:
    """`args` less the fields this Transformers version dropped (trainer.compat says which); any other name
    TrainingArguments (or the method's TRL config, `trl`) does not have (a misspelt key) raises instead of
    disappearing. No fields: not installed."""
    if not fields:
        return args
    dropped = compat.stack().dropped_training_arguments
    kept = {k: v for k, v in args.items() if k not in dropped or k in trl}
    unknown = sorted(set(kept) - fields - trl)
    if unknown:
        version = compat.installed_version("transformers")
        raise UnknownTrainingArgument(
            f"TrainingArguments has no field {', '.join(unknown)} in transformers {version}: a misspelt name in "
            "a settings group's `arguments` (trainer/config/<group>.py), or one this version renamed (say so in "
            "trainer.compat)"
        )
    return kept


def build_training_arguments(cfg: RunConfig) -> Any:
    """transformers.TrainingArguments(**cfg.training_arguments) (a preference method: its TRL config); its refusals
    become a ConfigError (exit 2)."""
    import copy

    from transformers import TrainingArguments

    library_patches.install_torch_shims()
    library_patches.skip_deepspeed_import(bool(cfg.training_arguments.get("deepspeed")))
    arguments_class = method.arguments_class(cfg.settings)
    try:  # a copy: TrainingArguments fills nested dicts (fsdp_config, deepspeed) in place
        args = (arguments_class or TrainingArguments)(**copy.deepcopy(cfg.training_arguments))
    except (ValueError, TypeError, ImportError) as exc:
        raise ConfigError(f"TrainingArguments refused the configuration: {exc}") from None
    return one_gpu_per_process(args)


def one_gpu_per_process(args: Any) -> Any:
    """One process uses one GPU. Outside torch.distributed, Transformers sets n_gpu to every visible GPU and wraps
    the model in nn.DataParallel (slow, and MFU would read N times too high); TRAIN_NPROC_PER_NODE=1 means one."""
    if args.world_size == 1 and args.n_gpu > 1:
        log.info(
            "one process: training on %s only; the other %d visible GPU(s) stay idle (TRAIN_NPROC_PER_NODE=auto "
            "runs one process per GPU)", args.device, args.n_gpu - 1,
        )  # fmt: skip
        args._n_gpu = 1
    return args
