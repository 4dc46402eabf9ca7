"""A model folder's config.json as the memory prediction reads it (trainer/memory/predict.py's folder_shape): read, or
refused saying why: no readable file, one that is not JSON, or an architecture the prediction does not model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ShapeUnknown(ValueError):
    """A model folder whose shape the prediction cannot read: no readable config.json, one that is not JSON, or an
    architecture it does not model (its message says which)."""


SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
MODELLED = ("decoders whose config.json names hidden_size, num_hidden_layers, num_attention_heads, intermediate_size "
            "and vocab_size as Llama's does, with Llama's gated MLP (Llama, Mistral, Qwen2, Qwen3, Gemma) or routed "
            "experts named as Qwen3-MoE's, OLMoE's and Mixtral's")


def shape_config(folder: str | Path) -> dict[str, Any]:
    """The text model's config (a multimodal config's `text_config`) holding every one of SHAPE_FIELDS; ShapeUnknown
    otherwise."""
    path = Path(folder) / "config.json"
    try:
        c = json.loads(path.read_text())
    except OSError as exc:
        raise ShapeUnknown(f"{path} cannot be read ({exc.strerror}); point TRAIN_MODEL at a Hugging Face model "
                           "folder") from None  # fmt: skip
    except ValueError as exc:
        raise ShapeUnknown(f"{path} does not read as JSON ({exc}); copy the model folder again") from None
    c = c.get("text_config", c) if isinstance(c, dict) else {}
    missing = [name for name in SHAPE_FIELDS if name not in c]
    if missing:
        named = c.get("architectures") or []
        what = f"the architecture {named[0]}" if named else f"the model_type {c.get('model_type')!r}"
        raise ShapeUnknown(f"{what} is not modelled (its config.json has no {', '.join(missing)}): the prediction "
                           f"covers {MODELLED}")  # fmt: skip
    return dict(c)
