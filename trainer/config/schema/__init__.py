"""The TRAIN_* schema: the one place every environment variable of the trainer is declared.

Each group of settings is one field-only module of this package (paths.py, method.py, precision.py, ...);
`TrainSettings` assembles them into the one declaration. Parsing, validation, `python -m trainer config`, the README
table and `.env.example` are all derived from it. This package must stay importable without torch.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from trainer.config.schema.adapters import AdapterSettings
from trainer.config.schema.debug import DebugSettings
from trainer.config.schema.evaluation import EvalSettings
from trainer.config.schema.fields import (
    DATA,
    ENV_PREFIX,
    FIXED,
    FREE,
    GROUPS,
    NOT_RECORDED,
    OnResume,
    Toggle,
)
from trainer.config.schema.launch import LaunchSettings
from trainer.config.schema.method import MethodSettings
from trainer.config.schema.moe import MoeSettings
from trainer.config.schema.optim import OptimSettings
from trainer.config.schema.outputs import OutputSettings
from trainer.config.schema.paths import PathSettings
from trainer.config.schema.precision import PrecisionSettings
from trainer.config.schema.schedule import ScheduleSettings
from trainer.config.schema.sharding import ShardingSettings
from trainer.config.schema.speed import SpeedSettings

__all__ = [
    "DATA", "ENV_PREFIX", "FIXED", "FREE", "GROUPS", "NOT_RECORDED", "OnResume", "Toggle", "TrainSettings",
    "env_name", "field_names", "field_of_env", "resume_rule",
]  # fmt: skip


# The groups are listed last first: pydantic orders the fields from the last base to the first, and the docs (README,
# .env.example, `config`) present them in GROUPS' order.
class TrainSettings(
    LaunchSettings, OutputSettings, DebugSettings, EvalSettings, ScheduleSettings, MoeSettings, AdapterSettings,
    SpeedSettings,
    ShardingSettings, OptimSettings, PrecisionSettings, MethodSettings, PathSettings, BaseSettings,
):  # fmt: skip
    """Every TRAIN_* variable. Field name `foo_bar` is environment variable `TRAIN_FOO_BAR`."""

    model_config = SettingsConfigDict(  # allow_inf_nan: TRAIN_ROPE_FACTOR=inf or TRAIN_LR=nan exit 2 at the check
        env_prefix=ENV_PREFIX, extra="ignore", case_sensitive=False, validate_default=True, frozen=True,
        allow_inf_nan=False)  # fmt: skip


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def field_of_env(name: str) -> str | None:
    """`TRAIN_LORA_R` -> `lora_r`; None for a name that is no field."""
    if not name.upper().startswith(ENV_PREFIX):
        return None
    field = name[len(ENV_PREFIX) :].lower()
    return field if field in TrainSettings.model_fields else None


def field_names() -> list[str]:
    return list(TrainSettings.model_fields)


def resume_rule(field: str) -> OnResume:
    """What a change of `field` means on resume; KeyError or ValueError for a field declared without one."""
    extra = TrainSettings.model_fields[field].json_schema_extra
    return OnResume((extra if isinstance(extra, dict) else {})["on_resume"])
