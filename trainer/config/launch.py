"""The launch group's home (TRAIN_NPROC_PER_NODE, TRAIN_MAX_RESTARTS, TRAIN_RDZV_TIMEOUT): the processes per node
(the launcher, trainer/launch/, reads the restarts and the rendezvous timeout) and the TrainingArguments of a
process among others."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.config.decision import Decision, Decisions, SoFar
from trainer.errors import ConfigError
from trainer.machine.gpus import NprocError, processes_per_node

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware

DDP_TIMEOUT_S = 3600  # saving a large sharded checkpoint can outlast the 30 min default


def problems(inputs: Inputs) -> list[str]:
    return []


def decide_nproc(s: TrainSettings, hw: Hardware) -> Decision[int]:
    gpus = hw.gpu_count if hw.is_gpu else 0
    try:
        count, reason = processes_per_node(s.nproc_per_node, gpus, f"{gpus} GPU(s) seen by torch")
    except NprocError as exc:
        raise ConfigError(str(exc)) from None
    return Decision(count, reason)


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    nproc = so_far.attempt(decide_nproc, inputs.settings, hardware, fallback=Decision(1, "refused"))
    return {"nproc_per_node": nproc}


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    return {
        "ddp_timeout": DDP_TIMEOUT_S,
        # every trainable parameter takes part in each step (LoRA's frozen weights are not DDP parameters), so
        # DDP need not search the graph for unused ones after every backward
        "ddp_find_unused_parameters": False,
        "use_cpu": not hardware.is_gpu,
    }
