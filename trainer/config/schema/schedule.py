"""The TRAIN_* settings of the group "Schedule, checkpoints and resume".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/schedule.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trainer.config.schema.fields import DATA, FREE, NOT_RECORDED, setting


class ScheduleSettings(BaseModel):
    max_steps: int = setting(
        -1, "schedule", "Stop after this many optimizer steps; -1 uses TRAIN_EPOCHS.", on_resume=FREE
    )
    epochs: float = setting(1.0, "schedule", "Epochs over the data when TRAIN_MAX_STEPS is -1.", gt=0, on_resume=FREE)
    save_steps: int = setting(
        200, "schedule", "Write a checkpoint every N steps (and always on interruption).", ge=1, on_resume=FREE
    )
    save_total_limit: int = setting(3, "schedule", "Keep at most this many checkpoints.", ge=1, on_resume=FREE)
    log_steps: int = setting(10, "schedule", "Log metrics every N steps.", ge=1, on_resume=FREE)
    on_nan: Literal["stop", "skip"] = setting(
        "stop", "schedule",
        "A non-finite loss or gradient norm (a diverged run, e.g. TRAIN_LR=3e4 for 3e-4). stop: end the run with "
        "exit 4, no checkpoint of non-finite weights, no final/, nothing pushed (checked at logging steps and before "
        "every save, without a per-step GPU synchronization). skip: skip that optimizer step (one synchronization "
        "per step) and stop like `stop` after 10 skipped in a row.",
        on_resume=FREE,
    )
    seed: int = setting(42, "schedule", "Random seed.", on_resume=DATA)
    resume: str = setting(
        "auto", "schedule",
        "auto: resume from the newest complete checkpoint in the output folder; never; or a checkpoint PATH.",
        on_resume=NOT_RECORDED,
    )
    resume_changed_data: bool = setting(
        False, "schedule",
        "Resume although the data settings (TRAIN_DATA, TRAIN_SEQ_LEN, TRAIN_SEED, the batch...) changed since the "
        "checkpoint; without it such a resume exits 2 naming the changes.",
        on_resume=NOT_RECORDED,
    )
    start_over: bool = setting(
        False, "schedule",
        "With TRAIN_RESUME=never in a folder holding an earlier run: move its checkpoints, final/ and metrics.jsonl "
        "to previous-runs/<time>/ and start over (without it, such a start exits 2).",
        on_resume=NOT_RECORDED,
    )
    args: str = setting(
        "", "schedule",
        "Further TrainingArguments flags, e.g. '--lr_scheduler_type cosine --warmup_steps 0.05 --weight_decay 0.1'; "
        "they win over values trainkit derives.",
        on_resume=FREE,
    )
