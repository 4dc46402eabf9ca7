"""The schedule group's home (TRAIN_MAX_STEPS, TRAIN_EPOCHS, TRAIN_SAVE_*, TRAIN_LOG_STEPS, TRAIN_ON_NAN, TRAIN_SEED,
TRAIN_RESUME*, TRAIN_START_OVER, TRAIN_ARGS): their checks, decisions and TrainingArguments, and TRAIN_ARGS' flags put
on top of every group's. What to resume from is decided by trainer/config/resume.py, what a run does on a NaN by
trainer/run/divergence.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import transformers_names
from trainer.config import method
from trainer.config.decision import Decision, Decisions, SoFar
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware

RESUME_WORDS = ("auto", "never")  # TRAIN_RESUME's words; anything else is a checkpoint folder


def resume_problems(s: TrainSettings) -> list[str]:
    """What is wrong with TRAIN_RESUME, known without reading the checkpoint (trainer.config.resume reads it)."""
    if s.resume in RESUME_WORDS or Path(s.resume).is_dir():
        return []
    return [f"TRAIN_RESUME={s.resume!r}: no such checkpoint folder; use auto, never or an existing checkpoint-N path"]


def _train_args_problems(s: TrainSettings) -> list[str]:
    try:
        tokens = transformers_names.split_train_args(s.args)
        if method.on_trl(s):
            owner = f"TRL {method.config_name(s)}"
            return transformers_names.check_train_args(tokens, method.config_fields(s.method), owner)
        return transformers_names.check_train_args(tokens)
    except ConfigError as exc:
        return exc.problems


def problems(inputs: Inputs) -> list[str]:
    s = inputs.settings
    return [*_train_args_problems(s), *resume_problems(s)]


def _resume_reason(resume: str) -> str:
    return {
        "auto": "resume from the newest complete checkpoint in the output folder, if any",
        "never": "always start from scratch",
    }.get(resume, "resume from this checkpoint")


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    resume = inputs.settings.resume
    return {"resume": Decision(resume, _resume_reason(resume))}


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    s = settings
    return {
        "max_steps": s.max_steps,
        "num_train_epochs": s.epochs,
        "save_strategy": "steps",
        "save_steps": s.save_steps,
        "save_total_limit": s.save_total_limit,
        "save_safetensors": True,
        "logging_strategy": "steps",
        "logging_steps": s.log_steps,
        "logging_first_step": True,
        "seed": s.seed,
    }


def with_user_arguments(s: TrainSettings, derived: dict[str, Any], parse: bool) -> tuple[dict[str, Any], Decision]:
    """TRAIN_ARGS on top of every group's arguments: the user's flags win, and the decision says which ones did."""
    tokens = transformers_names.split_train_args(s.args)
    if not tokens:
        return derived, Decision({}, "TRAIN_ARGS empty")
    arguments_class = method.arguments_class(s) if parse else None
    user = transformers_names.parse_train_args(tokens, arguments_class) if parse else {}
    overridden = sorted(k for k in user if k in derived and derived[k] != user[k])
    reason = "TrainingArguments flags from TRAIN_ARGS; they win over derived values"
    if overridden:
        reason += " (overrode: " + ", ".join(overridden) + ")"
    return {**derived, **user}, Decision(user, reason)
