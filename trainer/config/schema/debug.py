"""The TRAIN_* settings of the group "Profiling and reproducibility".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/debug.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from pydantic import BaseModel

from trainer.config.schema.fields import FREE, setting


class DebugSettings(BaseModel):
    deterministic: bool = setting(False, "debug", "Deterministic algorithms (slower; for bisecting).", on_resume=FREE)
    profile: bool = setting(
        False, "debug",
        "torch.profiler traces of steps 3-5 under OUTPUT_DIR/profile, viewable in TensorBoard, and "
        "summary-rank<N>.txt there: the operators that took the most time.",
        on_resume=FREE,
    )
    memory_snapshot: bool = setting(
        False, "debug", "Write a CUDA memory snapshot (OUTPUT_DIR/memory_snapshot.pickle) for pytorch.org/memory_viz.",
        on_resume=FREE,
    )
