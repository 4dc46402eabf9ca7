"""The TRAIN_* settings of the group "Precision".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/precision.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trainer.config.schema.fields import FREE, Toggle, setting


class PrecisionSettings(BaseModel):
    precision: Literal["auto", "fp32", "fp16", "bf16", "fp8"] = setting(
        "auto", "precision", "Mixed precision. auto: bf16 where the GPU supports it, else fp16 on GPUs, fp32 on CPU. "
        "fp8 (opt-in): torchao's float8 matmuls in the decoder's linear layers inside bf16 autocast (GPUs with FP8 "
        "tensor cores: compute capability 8.9+); its MFU is bf16-equivalent.", on_resume=FREE,
    )
    tf32: Toggle = setting(
        "auto", "precision", "TensorFloat-32 matmuls. auto: on for Ampere and newer GPUs.", on_resume=FREE
    )
