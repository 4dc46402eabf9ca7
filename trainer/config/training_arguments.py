"""Transformers' `TrainingArguments` kwargs from the settings and the decisions, then TRAIN_ARGS on top."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import compat, transformers_names
from trainer.config import precision, speed
from trainer.config.decisions import Decision, Decisions
from trainer.config.presets import is_preset
from trainer.config.schema import TrainSettings
from trainer.config.sharding import fsdp_checkpoints_activations, fsdp_wrap_class, uses_fsdp
from trainer.data.mix import eval_set_names
from trainer.errors import ConfigError
from trainer.trackers.environment import run_name

if TYPE_CHECKING:
    from trainer.config.run_config import RunConfig
    from trainer.machine.hardware import Hardware

log = logging.getLogger("trainer")
DDP_TIMEOUT_S = 3600  # saving a large sharded checkpoint can outlast the 30 min default


def _fsdp_arguments(s: TrainSettings) -> dict[str, Any]:
    if not uses_fsdp(s):
        return {}
    wrap, checkpointing = fsdp_wrap_class(s), fsdp_checkpoints_activations(s)
    return compat.fsdp_arguments(s.fsdp, wrap, checkpointing, from_folder=not is_preset(s.model))


def _checkpointing_arguments(s: TrainSettings) -> dict[str, Any]:
    if fsdp_checkpoints_activations(s):
        return {}  # in fsdp_config
    name = compat.stack().checkpointing_name
    args: dict[str, Any] = {name: s.grad_ckpt}
    if s.grad_ckpt:
        args[f"{name}_kwargs"] = {"use_reentrant": False}
    return args


def _eval_arguments(s: TrainSettings) -> dict[str, Any]:
    """Transformers' own evaluation schedule; TRAIN_KEEP_BEST is load_best_model_at_end on eval_loss, which also
    keeps the best checkpoint out of rotation. Only the loss is computed (logits are not gathered)."""
    if not (s.eval_data or s.eval_split > 0):
        return {"eval_strategy": "no"}
    args: dict[str, Any] = {
        "eval_strategy": "steps",
        "eval_steps": s.eval_steps or s.save_steps,
        "per_device_eval_batch_size": s.batch_size,
        "prediction_loss_only": True,
    }
    if s.keep_best:
        first = eval_set_names(s.data, s.eval_data, s.eval_split)[:1]  # several eval sets: the first one decides
        metric = f"eval_{first[0]}_loss" if first else "eval_loss"
        args.update(load_best_model_at_end=True, metric_for_best_model=metric, greater_is_better=False)
    return args


def _compile_arguments(s: TrainSettings, decisions: Decisions, ds: dict[str, Any] | None) -> dict[str, Any]:
    # Transformers turns torch_compile on when a backend or mode is given, so pass them only when it compiles.
    if not decisions.compile.value:
        return {"torch_compile": False}
    # A partial last batch would recompile the model for its shape: a compiled run's training DataLoader drops it
    # (a different random one each epoch; trainer.run.train counts and records what is left out).
    if not speed.compiled_by_accelerate(s, ds):
        return {"torch_compile": False, "dataloader_drop_last": True}  # trainer.run.training_model compiles each layer
    return {"torch_compile": True, "torch_compile_backend": s.compile_backend, "torch_compile_mode": s.compile_mode,
            "dataloader_drop_last": True}  # fmt: skip


def _speed_arguments(decisions: Decisions) -> dict[str, Any]:
    """Liger's kernels, and the host-device syncs a step need not make (trainer.config.speed)."""
    args: dict[str, Any] = {
        "use_liger_kernel": decisions.liger.value,
        "logging_nan_inf_filter": decisions.nan_inf_filter.value,
    }
    if decisions.non_blocking.value:
        args["accelerator_config"] = {"non_blocking": True}
    return args


def derived_training_arguments(
    s: TrainSettings, hw: Hardware, decisions: Decisions, ds: dict[str, Any] | None
) -> dict[str, Any]:
    """TrainingArguments kwargs from TRAIN_* and the decisions (before TRAIN_ARGS)."""
    fields = transformers_names.training_argument_fields()
    optim = decisions.optim.value
    args: dict[str, Any] = {
        "output_dir": s.output_dir,
        "per_device_train_batch_size": s.batch_size,
        "gradient_accumulation_steps": decisions.grad_accum.value,
        "auto_find_batch_size": False,  # TRAIN_AUTO_BATCH searches before training (trainer.run.batch_search)
        "learning_rate": s.lr,
        "max_steps": s.max_steps,
        "num_train_epochs": s.epochs,
        "save_strategy": "steps",
        "save_steps": s.save_steps,
        "save_total_limit": s.save_total_limit,
        "save_safetensors": True,
        "logging_strategy": "steps",
        "logging_steps": s.log_steps,
        "logging_first_step": True,
        "logging_dir": str(Path(s.output_dir) / "runs"),
        "report_to": decisions.report_to.value,
        "run_name": run_name(s.output_dir),  # the trackers' run name (trainer.trackers)
        "seed": s.seed,
        "full_determinism": s.deterministic,
        **precision.training_arguments(decisions.precision.value),
        "tf32": decisions.tf32.value if hw.is_gpu else None,
        "optim": "adamw_torch" if optim in ("deepspeed", transformers_names.APEX_FUSED) else optim,
        "dataloader_num_workers": s.num_workers,
        "dataloader_pin_memory": decisions.pin_memory.value,
        "dataloader_persistent_workers": s.num_workers > 0,
        "remove_unused_columns": False,
        "ddp_timeout": DDP_TIMEOUT_S,
        # every trainable parameter takes part in each step (LoRA's frozen weights are not DDP parameters), so
        # DDP need not search the graph for unused ones after every backward
        "ddp_find_unused_parameters": False,
        "use_cpu": not hw.is_gpu,
        "neftune_noise_alpha": s.neftune_alpha or None,
        "deepspeed": ds,
        **_checkpointing_arguments(s),
        **_compile_arguments(s, decisions, ds),
        **_speed_arguments(decisions),
        **_fsdp_arguments(s),
        **_eval_arguments(s),
    }
    return known_arguments(args, fields)


class UnknownTrainingArgument(ValueError):
    """trainkit derived a TrainingArguments field the installed Transformers does not have: a bug, not a user's
    mistake (exit 1 with the traceback)."""


def known_arguments(args: dict[str, Any], fields: frozenset[str]) -> dict[str, Any]:
    """`args` less the fields this Transformers version dropped (trainer.compat says which); any other name
    TrainingArguments does not have (a misspelt key) raises instead of disappearing. No fields: not installed."""
    if not fields:
        return args
    dropped = compat.stack().dropped_training_arguments
    kept = {k: v for k, v in args.items() if k not in dropped}
    unknown = sorted(set(kept) - fields)
    if unknown:
        version = compat.installed_version("transformers")
        raise UnknownTrainingArgument(
            f"TrainingArguments has no field {', '.join(unknown)} in transformers {version}: a misspelt name in "
            "trainer/config/training_arguments.py, or one this version renamed (say so in trainer.compat)"
        )
    return kept


def apply_user_arguments(
    s: TrainSettings, derived: dict[str, Any], parse: bool
) -> tuple[dict[str, Any], Decision]:
    """TRAIN_ARGS on top of the derived kwargs: the user's flags win, and the decision says which ones did."""
    tokens = transformers_names.split_train_args(s.args)
    if not tokens:
        return derived, Decision({}, "TRAIN_ARGS empty")
    from trainer.config import methods

    arguments_class = methods.config_class(s.method) if parse and methods.on_trl(s) else None
    user = transformers_names.parse_train_args(tokens, arguments_class) if parse else {}
    overridden = sorted(k for k in user if k in derived and derived[k] != user[k])
    reason = "TrainingArguments flags from TRAIN_ARGS; they win over derived values"
    if overridden:
        reason += " (overrode: " + ", ".join(overridden) + ")"
    return {**derived, **user}, Decision(user, reason)


def build_training_arguments(cfg: RunConfig) -> Any:
    """transformers.TrainingArguments(**cfg.training_arguments) (a preference method: its TRL config); its refusals
    become a ConfigError (exit 2)."""
    import copy

    from transformers import TrainingArguments

    from trainer.config import methods

    compat.install_torch_shims()
    arguments_class = methods.config_class(cfg.settings.method) if methods.on_trl(cfg.settings) else None
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
