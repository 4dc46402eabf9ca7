"""What sharding means in trainkit, each rule once: what FSDP wraps, that FSDP owns activation checkpointing when it
is on, and which runs need torch.distributed even as one process. The training arguments, the decisions' reasons and
the run's model loading all ask here; torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.config.presets import PRESET_BLOCK_CLASS, is_preset

if TYPE_CHECKING:
    from trainer.config.schema import TrainSettings


def uses_fsdp(s: TrainSettings) -> bool:
    """TRAIN_FSDP shards parameters, gradients and optimizer state (FSDP; DeepSpeed ZeRO is the other way)."""
    return s.fsdp != "none"


def fsdp_wrap_class(s: TrainSettings) -> str | None:
    """The decoder block FSDP wraps: a preset's Llama layer; None: the model's own `_no_split_modules`."""
    return PRESET_BLOCK_CLASS if is_preset(s.model) else None


def fsdp_checkpoints_activations(s: TrainSettings) -> bool:
    """With FSDP, activation checkpointing is FSDP's (fsdp_config), never Transformers' or PEFT's as well: switched
    on twice it would wrap twice and all-gather redundantly."""
    return uses_fsdp(s) and s.grad_ckpt


def needs_process_group(s: TrainSettings, deepspeed: dict[str, Any] | None) -> bool:
    """DeepSpeed and FSDP run inside torch.distributed, even as a world of one process."""
    return bool(deepspeed) or uses_fsdp(s)
