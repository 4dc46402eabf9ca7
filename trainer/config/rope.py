"""RoPE scaling (TRAIN_ROPE_SCALING, TRAIN_ROPE_FACTOR): what a model config allows and the scaling it gets.

Torch-free: the checks read a preset's shape or a model folder's config.json; the model loader (trainer.model) calls
`scale_rope` on the loaded config (first checked there for Hub models), which writes the scaling through trainer.compat.
The model's max_position_embeddings stays its pretrained length (linear, dynamic and yarn read it as such), except
for llama3, which keeps the pretrained length in its own original_max_position_embeddings (as Llama 3.1 does).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.compat import set_rope_scaling
from trainer.config.presets import PRESET_MAX_POSITIONS, PRESET_ROPE_THETA, is_preset
from trainer.config.schema import TrainSettings
from trainer.errors import ConfigError

log = logging.getLogger("trainer")

SCALINGS = "linear, dynamic, yarn or llama3"
LLAMA3_FREQ_FACTORS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}  # Llama 3.1's own values


def _scaling(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The RoPE scaling a model config carries (transformers 4's rope_scaling, 5's rope_parameters), if any."""
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if isinstance(value, Mapping) and (value.get("rope_type") or value.get("type")) not in (None, "default"):
            return value
    return None


def existing_scaling(config: Mapping[str, Any]) -> str | None:
    """The type of RoPE scaling a model config already carries, or None."""
    scaling = _scaling(config)
    return None if scaling is None else str(scaling.get("rope_type") or scaling.get("type"))


def context_length(config: Mapping[str, Any]) -> int | None:
    """The positions a model config can take: max_position_embeddings, stretched by its RoPE scaling's factor unless
    the scaling keeps the pretrained length apart (original_max_position_embeddings below it: llama3, longrope)."""
    limit = config.get("max_position_embeddings")
    scaling = _scaling(config)
    if not isinstance(limit, int) or scaling is None or not isinstance(scaling.get("factor"), (int, float)):
        return limit if isinstance(limit, int) else None
    original = scaling.get("original_max_position_embeddings")
    return limit if isinstance(original, int) and original < limit else round(limit * scaling["factor"])


def _uses_rope(config: Mapping[str, Any]) -> bool:
    return any(key in config for key in ("rope_theta", "rope_scaling", "rope_parameters"))


def readable_model_config(s: TrainSettings) -> dict[str, Any] | None:
    """A preset's positions, or a model folder's config.json; None when only the run can know (a Hub ID)."""
    if is_preset(s.model):
        return {"max_position_embeddings": PRESET_MAX_POSITIONS, "rope_theta": PRESET_ROPE_THETA}
    try:
        config = json.loads((Path(s.model) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # a Hub ID, or a folder _model_problems already names
    return config if isinstance(config, dict) else None


def _factor_problems(s: TrainSettings) -> list[str]:
    if s.rope_scaling == "none" and s.rope_factor:
        return [f"TRAIN_ROPE_FACTOR={s.rope_factor:g} has no effect without TRAIN_ROPE_SCALING; set "
                f"TRAIN_ROPE_SCALING ({SCALINGS}) or unset TRAIN_ROPE_FACTOR"]  # fmt: skip
    if s.rope_scaling != "none" and (s.rope_factor < 0 or 0 < s.rope_factor <= 1):
        return [f"TRAIN_ROPE_FACTOR={s.rope_factor:g}: the factor must be above 1 (2 doubles the context), or 0 to "
                "take TRAIN_SEQ_LEN / the model's max_position_embeddings"]  # fmt: skip
    return []


def _unscaled_problems(s: TrainSettings, config: Mapping[str, Any]) -> list[str]:
    limit = context_length(config)
    if limit is None or s.seq_len <= limit:
        return []
    if existing_scaling(config):
        return [f"TRAIN_SEQ_LEN={s.seq_len} is above the {limit} positions TRAIN_MODEL={s.model}'s RoPE scaling "
                f"reaches; set TRAIN_SEQ_LEN={limit} or less"]  # fmt: skip
    return [f"TRAIN_SEQ_LEN={s.seq_len} is above TRAIN_MODEL={s.model}'s max_position_embeddings ({limit}): set "
            f"TRAIN_ROPE_SCALING ({SCALINGS}; the factor is TRAIN_SEQ_LEN / {limit} unless TRAIN_ROPE_FACTOR says), "
            f"or TRAIN_SEQ_LEN={limit} or less"]  # fmt: skip


def _scaled_problems(s: TrainSettings, config: Mapping[str, Any], limit: int | None) -> list[str]:
    name = f"TRAIN_ROPE_SCALING={s.rope_scaling} with TRAIN_MODEL={s.model}"
    if not _uses_rope(config):
        kind = config.get("model_type", "this model")
        return [f"{name}: {kind} has no rotary position embeddings to scale; unset TRAIN_ROPE_SCALING"]
    if (kind := existing_scaling(config)) is not None:
        return [f"{name}: the model already carries RoPE scaling ({kind}), which training keeps; unset "
                "TRAIN_ROPE_SCALING (or give a model without it)"]  # fmt: skip
    if limit is None:
        return [f"{name}: its config.json has no max_position_embeddings to scale from"]
    if not s.rope_factor and s.seq_len <= limit:
        return [f"{name}: TRAIN_SEQ_LEN={s.seq_len} is within its {limit} positions, so there is no factor to derive; "
                f"set TRAIN_ROPE_FACTOR (e.g. 2) or a TRAIN_SEQ_LEN above {limit}"]  # fmt: skip
    if s.rope_factor and s.seq_len > limit * s.rope_factor:
        return [f"{name}: TRAIN_SEQ_LEN={s.seq_len} is above {limit} x TRAIN_ROPE_FACTOR={s.rope_factor:g}; raise "
                f"TRAIN_ROPE_FACTOR to {s.seq_len / limit:g} or more, or set it to 0 to derive it"]  # fmt: skip
    return []


def rope_problems(s: TrainSettings, config: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with the RoPE settings for this model config (None: not known yet, only the factor is checked)."""
    problems = _factor_problems(s)
    if problems or config is None:
        return problems
    limit = config.get("max_position_embeddings")
    limit = limit if isinstance(limit, int) else None
    if s.rope_scaling == "none":
        return _unscaled_problems(s, config)
    return _scaled_problems(s, config, limit)


def rope_parameters(s: TrainSettings, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The scaling to write into the model's config (rope_type, factor, ...); None without TRAIN_ROPE_SCALING.
    Call after `rope_problems` found nothing."""
    if s.rope_scaling == "none":
        return None
    limit = int(config["max_position_embeddings"])
    params: dict[str, Any] = {"rope_type": s.rope_scaling, "factor": float(s.rope_factor or s.seq_len / limit)}
    if s.rope_scaling == "llama3":
        params.update(LLAMA3_FREQ_FACTORS, original_max_position_embeddings=limit)
    return params


def max_positions_after(params: Mapping[str, Any], limit: int) -> int:
    """The model's max_position_embeddings once scaled: llama3 states the stretched length, the others the original."""
    return round(limit * params["factor"]) if params["rope_type"] == "llama3" else limit


def scale_rope(config: Any, s: TrainSettings) -> Any:
    """TRAIN_ROPE_SCALING written into a model's config (a transformers PretrainedConfig), so final/, exports and
    pushes load with it. The checks ask the same rules before torch for presets and folders; a Hub model's config
    is first read by the run, here."""
    problems = rope_problems(s, config.to_dict())
    if problems:
        raise ConfigError(*problems)
    params = rope_parameters(s, config.to_dict())
    if params is not None:
        set_rope_scaling(config, params)
        config.max_position_embeddings = max_positions_after(params, config.max_position_embeddings)
        log.info("RoPE scaling: %s, factor %g over %d positions", params["rope_type"], params["factor"],
                 config.max_position_embeddings)  # fmt: skip
    return config

