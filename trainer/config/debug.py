"""The debug group's home (TRAIN_DETERMINISTIC, TRAIN_PROFILE, TRAIN_MEMORY_SNAPSHOT): their decisions and
TrainingArguments (the group has no check that needs no machine). The profiler is trainer/run/profiling.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.config.decision import Decision, Decisions, SoFar
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware


def problems(inputs: Inputs) -> list[str]:
    return []


def _decide_debug(s: TrainSettings, hw: Hardware) -> dict[str, Decision]:
    if s.memory_snapshot and not hw.is_gpu:
        raise ConfigError("TRAIN_MEMORY_SNAPSHOT=1 records CUDA allocations and needs a CUDA GPU; set it to 0 on CPU")
    return {
        "profile": Decision(
            s.profile, "torch.profiler traces in OUTPUT_DIR/profile" if s.profile else "TRAIN_PROFILE=0"
        ),
        "memory_snapshot": Decision(
            s.memory_snapshot, "OUTPUT_DIR/memory_snapshot.pickle" if s.memory_snapshot else "TRAIN_MEMORY_SNAPSHOT=0"
        ),
        "deterministic": Decision(
            s.deterministic,
            "full_determinism: deterministic algorithms, slower" if s.deterministic else "seeded, not bit-exact",
        ),
    }


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    return so_far.attempt(_decide_debug, inputs.settings, hardware, fallback={})


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    return {"full_determinism": settings.deterministic}
