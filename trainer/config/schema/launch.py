"""The TRAIN_* settings of the group "Launch".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/launch.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from pydantic import BaseModel, field_validator

from trainer.config.schema.fields import FREE, setting


class LaunchSettings(BaseModel):
    nproc_per_node: str = setting(
        "auto", "launch", "Processes per node. auto: one per visible GPU (one on CPU). A resume on another count "
        "keeps the effective batch (docs/running.md).", on_resume=FREE)  # fmt: skip
    max_restarts: int = setting(
        3, "launch", "Elastic restarts of the worker group (torchrun --max-restarts) before the job fails; "
        "each restart resumes from the newest checkpoint.", ge=0,
        on_resume=FREE,
    )
    rdzv_timeout: int = setting(
        600, "launch", "Seconds the nodes of a multi-node job wait for each other at start and after a restart.", ge=1,
        on_resume=FREE,
    )

    @field_validator("nproc_per_node")
    @classmethod
    def _auto_or_positive_int(cls, value: str) -> str:
        if value != "auto" and not (value.isdigit() and int(value) >= 1):
            raise ValueError("expected auto or a whole number >= 1")
        return value
