"""The TRAIN_* settings of the group "Mixture of experts".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/moe.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trainer.config.schema.fields import FREE, setting


class MoeSettings(BaseModel):
    moe_impl: Literal["auto", "eager", "batched_mm", "grouped_mm"] = setting(
        "auto", "moe", "How a mixture of experts' routed experts run (Transformers' experts implementation): eager "
        "loops over the experts that got tokens, batched_mm gathers each token's expert weights into one batched "
        "matmul, grouped_mm sorts the tokens by expert for one grouped GEMM per projection. auto: grouped_mm on GPUs "
        "of compute capability 8.0 or more and on CPUs with torch 2.9 or newer (its kernels), else eager.",
        on_resume=FREE,
    )
    moe_aux_loss: str = setting(
        "auto", "moe", "The load-balancing loss's coefficient (the loss is logged as router/aux_loss either way). "
        "auto: the model family's own router_aux_loss_coef (Qwen3-MoE 0.001, OLMoE 0.01; none for a family that "
        "defines none, such as DeepSeek-V3); off: not added; a number >= 0: that coefficient.",
        on_resume=FREE,
    )
