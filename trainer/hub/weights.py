"""Weights that must not be published: a damaged safetensors file, or a tensor holding NaN or Inf (a diverged run's
weights, TRAIN_ON_NAN). `export` and `push` (and so TRAIN_PUSH_TO_HUB) ask `check_weights` first; each problem is
one ConfigError (exit 2) naming the file, or the first non-finite tensor. torch and safetensors load on first use.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

DIVERGED_HINT = ("the run diverged (its log says where; TRAIN_ON_NAN); use its last finite checkpoint, e.g. "
                 "`python -m trainer export OUTPUT_DIR/checkpoint-N OUT`")  # fmt: skip


def first_nonfinite(named: Iterable[tuple[str, Any]]) -> str | None:
    """The name of the first floating-point tensor holding a NaN or Inf, else None."""
    import torch

    for name, tensor in named:
        if torch.is_tensor(tensor) and torch.is_floating_point(tensor) and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def check_weights(folder: Path, what: str) -> None:
    """Every *.safetensors file in `folder` is readable and finite; a ConfigError naming the first problem."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as weights:
                bad = first_nonfinite((key, weights.get_tensor(key)) for key in weights.keys())  # noqa: SIM118
        except (SafetensorError, OSError) as exc:
            raise ConfigError(
                f"{what}: {file} is damaged ({str(exc).splitlines()[0][:200]}); copy it again, or use another "
                "checkpoint of the run"
            ) from None
        if bad:
            raise ConfigError(f"{what}: {file} holds non-finite weights (NaN or Inf), first in tensor {bad!r}: "
                              f"{DIVERGED_HINT}")  # fmt: skip
