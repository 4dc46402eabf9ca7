"""Stage 1: TRAIN_* -> TrainSettings, with one clear line per unknown name or bad value (no torch)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from pydantic import ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from trainer.config.checks import static_problems
from trainer.config.inputs import Inputs
from trainer.config.presets import MODEL_PRESETS
from trainer.config.schema import ENV_PREFIX, TrainSettings, env_name, field_of_env
from trainer.errors import ConfigError
from trainer.transformers_names import did_you_mean

log = logging.getLogger("trainer")


class _MappingSettings(TrainSettings):
    """TrainSettings validated from an explicit mapping only (the base class would also read os.environ)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def train_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The TRAIN_* entries of `env`, upper-cased names; empty values count as unset."""
    return {k.upper(): v for k, v in env.items() if k.upper().startswith(ENV_PREFIX) and v != ""}


def _unknown_names(variables: Mapping[str, Any]) -> list[str]:
    known = [env_name(f) for f in TrainSettings.model_fields]
    return [
        f"unknown variable {name}{did_you_mean(name, known)}; every TRAIN_* variable is listed in "
        "the README and .env.example"
        for name in variables
        if field_of_env(name) is None
    ]


def _describe_validation_error(error: ErrorDetails) -> str:
    field_name = str(error["loc"][0]) if error.get("loc") else "?"
    name = env_name(field_name)
    value = error.get("input")
    if error["type"] == "literal_error":
        return f"{name}={value!r} is not allowed; allowed values: {allowed_values(field_name)}"
    reason = error["msg"].removeprefix("Value error, ")
    allowed = allowed_values(field_name) if field_name in TrainSettings.model_fields else ""
    return f"{name}={value!r}: {reason[0].lower()}{reason[1:]}" + (f"; allowed values: {allowed}" if allowed else "")


OUTPUT_IN_IMAGE = "/output"  # TRAIN_OUTPUT_DIR's default in the image (the mounted output folder)


def default_output_dir() -> str:
    """TRAIN_OUTPUT_DIR when it is not set: /output in the image, else ./output of the current folder (absolute), so
    that nothing is written under the filesystem root of a user's machine."""
    from trainer.provenance import inside_image

    return OUTPUT_IN_IMAGE if inside_image() else os.path.abspath("output")


def parse_settings(env: Mapping[str, str] | None = None) -> TrainSettings:
    """TRAIN_* -> TrainSettings; every unknown name and bad value becomes one line of a ConfigError."""
    variables = train_variables(os.environ if env is None else env)
    values = _by_field(variables)
    given = set(values)
    values.setdefault("output_dir", default_output_dir())
    settings = _validated(values, _unknown_names(variables))
    # This place's default output folder is not the user's choice: the run record, the model card and reproduce
    # tell the settings the user set by model_fields_set.
    settings.model_fields_set.intersection_update(given)
    return settings


def settings_from_values(values: Mapping[str, Any]) -> TrainSettings:
    """TrainSettings from values by TRAIN_* name, as a record keeps them (JSON values, not environment strings):
    the same validation and the same error lines as `parse_settings`."""
    return _validated(_by_field(values), _unknown_names(values))


def _by_field(values: Mapping[str, Any]) -> dict[str, Any]:
    return {field: value for name, value in values.items() if (field := field_of_env(name))}


def _validated(values: dict[str, Any], problems: list[str]) -> TrainSettings:
    try:
        settings = _MappingSettings(**values)
    except ValidationError as exc:
        raise ConfigError(*problems, *(_describe_validation_error(e) for e in exc.errors())) from None
    if problems:
        raise ConfigError(*problems)
    return settings


def load_inputs(env: Mapping[str, str] | None = None) -> Inputs:
    """Parse TRAIN_* from `env` (os.environ by default) and run every check that needs no torch; the settings with
    the Hub snapshots and data scans the checks made, for `resolve` and the run."""
    inputs = Inputs(parse_settings(env))
    if "TRAIN_OUTPUT_DIR" not in train_variables(os.environ if env is None else env) and (
            inputs.settings.output_dir != OUTPUT_IN_IMAGE):  # fmt: skip
        log.info("TRAIN_OUTPUT_DIR is not set and this is not the image: the output (and its data cache) go to %s",
                 inputs.settings.output_dir)  # fmt: skip
    problems = static_problems(inputs)
    if problems:
        raise ConfigError(*problems)
    return inputs


def load_settings(env: Mapping[str, str] | None = None) -> TrainSettings:
    """`load_inputs(env).settings`: the checked settings alone."""
    return load_inputs(env).settings


# What each free-text field accepts, for error messages and the docs (Literal, bool and number fields say it
# through their type).
TEXT_ALLOWED = {
    "model": "a preset (" + ", ".join(MODEL_PRESETS) + "), a model folder with config.json or a Hub ID",
    "tokenizer": "empty, a tokenizer folder or a Hub ID",
    "eval_data": "empty, a file, folder, glob or Hub dataset",
    "data": "a file, folder, glob or Hub dataset (hf://datasets/org/name[@revision][/path])",
    "output_dir": "a writable folder",
    "text_field": "a column name",
    "chat_template": "empty, a built-in (chatml) or a .jinja file",
    "optim": "auto or a Transformers optimizer name",
    "nvme_path": "a writable folder",
    "deepspeed_config": "empty or a JSON file",
    "compile_backend": "a torch.compile backend (inductor, cudagraphs, ...)",
    "lora_targets": "all-linear, attention, experts, shared_experts, router, or module names, comma-separated",
    "moe_aux_loss": "auto, off or a number >= 0",
    "resume": "auto, never or a checkpoint folder",
    "args": "TrainingArguments flags",
    "nproc_per_node": "auto or a whole number >= 1",
    "report_to": "a comma list of tensorboard, wandb, mlflow, or none",
    "push_to_hub": "empty or org/name[@branch]",
}


def allowed_values(field: str) -> str:
    """A short human description of what `field` accepts ("auto, fp32, fp16, bf16", "integer 0-3", "0 or 1")."""
    info = TrainSettings.model_fields[field]
    if field in TEXT_ALLOWED:
        return TEXT_ALLOWED[field]
    choices = get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
    if choices:
        return ", ".join(choices)
    if info.annotation is bool:
        return "0 or 1"
    kind = "integer" if info.annotation is int else "number" if info.annotation is float else "text"
    bounds = {type(m).__name__: getattr(m, type(m).__name__.lower()) for m in info.metadata if hasattr(m, "__slots__")}
    if "Ge" in bounds and "Le" in bounds:
        return f"{kind} {bounds['Ge']}-{bounds['Le']}"
    operators = (("Ge", ">="), ("Gt", ">"), ("Le", "<="), ("Lt", "<"))
    parts = [f"{op} {bounds[name]}" for name, op in operators if name in bounds]
    return f"{kind} " + " and ".join(parts) if parts else kind
