"""The TRAIN_* settings of the group "Memory: checkpointing, ZeRO, FSDP".

Fields only: their checks and decisions live in their concern's module; trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trainer.config.schema.fields import FIXED, FREE, setting


class MemorySettings(BaseModel):
    grad_ckpt: bool = setting(False, "memory", "Gradient (activation) checkpointing.", on_resume=FREE)
    zero_stage: int = setting(0, "memory", "DeepSpeed ZeRO stage, 0 (off) to 3.", ge=0, le=3, on_resume=FIXED)
    zero_offload: Literal["none", "cpu", "nvme"] = setting(
        "none", "memory", "Offload ZeRO optimizer state (and parameters at stage 3) to CPU or NVMe.",
        on_resume=FREE,
    )
    nvme_path: str = setting(
        "/nvme", "memory", "Folder on a fast local disk for TRAIN_ZERO_OFFLOAD=nvme.", on_resume=FREE
    )
    deepspeed_config: str = setting(
        "", "memory", "Path to a DeepSpeed JSON config; wins over the generated one.",
        on_resume=FREE,
    )
    memory_check: Literal["auto", "off"] = setting(
        "auto", "memory",
        "Will it fit? Before a GPU run loads its model, its peak GPU memory is predicted (docs/running.md, 'Will it "
        "fit?'); auto: a run predicted over the GPU's memory by more than the prediction's error exits 2, naming "
        "the cheapest changes predicted to fit. off: run anyway. `python -m trainer doctor --memory` shows it.",
        on_resume=FREE,
    )
    fsdp: Literal["none", "full_shard", "shard_grad_op", "hybrid_shard", "no_shard"] = setting(
        "none", "memory", "PyTorch FSDP sharding strategy (with auto-wrap of decoder layers).",
        on_resume=FIXED,
    )
