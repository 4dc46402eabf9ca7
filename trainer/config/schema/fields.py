"""What every TRAIN_* field is made of: the prefix, the documentation groups, the resume rule and `setting`."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import Field

ENV_PREFIX = "TRAIN_"

Toggle = Literal["auto", "0", "1"]


# Field groups, in the order docs present them (each is one module of this package).
GROUPS = {
    "paths": "Paths and data",
    "method": "Method: SFT, preference tuning or online RL",
    "precision": "Precision",
    "optim": "Optimizer and batch",
    "sharding": "Memory: checkpointing, ZeRO, FSDP",
    "speed": "Speed: compile and attention",
    "adapters": "LoRA / QLoRA",
    "moe": "Mixture of experts",
    "schedule": "Schedule, checkpoints and resume",
    "evaluation": "Evaluation",
    "debug": "Profiling and reproducibility",
    "outputs": "Trackers and Hub push",
    "launch": "Launch",
}


class OnResume(str, Enum):
    """What a change of a setting means when a run resumes from a checkpoint (trainer.config.resume.check_drift)."""

    FIXED = "cannot change"  # the checkpoint cannot continue with another value: exit 2
    DATA = "changes the data"  # the training data or its order: exit 2 unless TRAIN_RESUME_CHANGED_DATA=1
    FREE = "may change"  # the run goes on, and its log names the change
    NOT_RECORDED = "not recorded"  # steers this start (where, whether to resume): neither recorded nor compared


FIXED, DATA, FREE, NOT_RECORDED = OnResume.FIXED, OnResume.DATA, OnResume.FREE, OnResume.NOT_RECORDED


def setting(default: Any, group: str, doc: str, *, on_resume: OnResume, **kw: Any) -> Any:
    """A field with its documentation group (`doc` feeds the README and .env.example) and its resume rule."""
    if group not in GROUPS:
        raise ValueError(f"unknown settings group {group!r}: one of {', '.join(GROUPS)}")
    return Field(default, description=doc, json_schema_extra={"group": group, "on_resume": on_resume.value}, **kw)
