"""TRAIN_REPORT_TO: a comma list of tensorboard, wandb, mlflow, or none (no torch, no tracker import)."""

from __future__ import annotations

TRACKERS = ("tensorboard", "wandb", "mlflow")
NONE = "none"
ALLOWED = "a comma list of tensorboard, wandb, mlflow, or none"
# The module each tracker's Transformers callback imports (mlflow-skinny installs the `mlflow` module).
MODULES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",)}
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}


def parse_report_to(value: str) -> list[str]:
    """`tensorboard,wandb` -> ["tensorboard", "wandb"]; `none` -> []; ValueError naming what is wrong."""
    names = [n.strip().lower() for n in value.split(",")]
    if any(not n for n in names):
        raise ValueError(f"empty entry in the list; expected {ALLOWED}")
    unknown = [n for n in names if n not in (*TRACKERS, NONE)]
    if unknown:
        raise ValueError(f"unknown tracker {', '.join(repr(n) for n in unknown)}; expected {ALLOWED}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} named twice; name each tracker once")
    if NONE in names and len(names) > 1:
        raise ValueError("none cannot be combined with a tracker; use none alone or list the trackers")
    return [] if names == [NONE] else names


def normalized(value: str) -> str:
    """The canonical spelling stored in the settings (validated, lower case, no spaces)."""
    return ",".join(parse_report_to(value)) or NONE
