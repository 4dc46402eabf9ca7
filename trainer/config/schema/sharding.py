"""The TRAIN_* settings of the group "Memory: checkpointing, ZeRO, FSDP" (sharding, checkpointing, offload).

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/sharding.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trainer.config.schema.fields import FIXED, FREE, setting


class ShardingSettings(BaseModel):
    grad_ckpt: bool = setting(False, "sharding", "Gradient (activation) checkpointing.", on_resume=FREE)
    zero_stage: int = setting(0, "sharding", "DeepSpeed ZeRO stage, 0 (off) to 3.", ge=0, le=3, on_resume=FIXED)
    zero_offload: Literal["none", "cpu", "nvme"] = setting(
        "none", "sharding", "Offload ZeRO optimizer state (and parameters at stage 3) to CPU or NVMe.",
        on_resume=FREE,
    )
    nvme_path: str = setting(
        "/nvme", "sharding", "Folder on a fast local disk for TRAIN_ZERO_OFFLOAD=nvme.", on_resume=FREE
    )
    deepspeed_config: str = setting(
        "", "sharding", "Path to a DeepSpeed JSON config; wins over the generated one.",
        on_resume=FREE,
    )
    memory_check: Literal["auto", "off"] = setting(
        "auto", "sharding",
        "Will it fit? Before a GPU run loads its model, its peak GPU memory is predicted (docs/running.md, 'Will it "
        "fit?'); auto: a run predicted over the GPU's memory by more than the prediction's error exits 2, naming "
        "the cheapest changes predicted to fit. off: run anyway. `python -m trainer doctor --memory` shows it.",
        on_resume=FREE,
    )
    fsdp: Literal["none", "full_shard", "shard_grad_op", "hybrid_shard", "no_shard"] = setting(
        "none", "sharding", "PyTorch FSDP sharding strategy (with auto-wrap of decoder layers).",
        on_resume=FIXED,
    )
