"""The TRAIN_* settings of the group "Optimizer and batch".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/optim.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from pydantic import BaseModel

from trainer.config.schema.fields import DATA, FREE, Toggle, setting


class OptimSettings(BaseModel):
    optim: str = setting(
        "auto", "optim",
        "Any optimizer name Transformers accepts (adamw_torch, adamw_torch_fused, adamw_apex_fused, "
        "adamw_bnb_8bit, adafactor, ...). auto: adamw_torch_fused (on CPU: where torch has it, else adamw_torch).",
        on_resume=FREE,
    )
    lr: float = setting(3e-4, "optim", "Peak learning rate.", gt=0, on_resume=FREE)
    batch_size: int = setting(8, "optim", "Per-device micro-batch size (sequences).", ge=1, on_resume=DATA)
    grad_accum: int = setting(1, "optim", "Gradient accumulation steps.", ge=1, on_resume=DATA)
    auto_batch: Toggle = setting(
        "auto", "optim", "Before training, search the largest per-device batch that fits in GPU memory (all ranks "
        "agree; run_config.json records it). If TRAIN_BATCH_SIZE or TRAIN_GRAD_ACCUM is set, their product (the "
        "effective batch) is kept by gradient accumulation. auto: on with one GPU per process (no DeepSpeed, FSDP or "
        "quantization); off on CPU.",
        on_resume=FREE,
    )
    num_workers: int = setting(2, "optim", "DataLoader worker processes.", ge=0, on_resume=FREE)
    pin_memory: Toggle = setting("auto", "optim", "Pin DataLoader memory. auto: on when a GPU is used.", on_resume=FREE)
