"""The TRAIN_* settings of the group "LoRA / QLoRA".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/adapters.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trainer.config.schema.fields import FIXED, FREE, setting


class AdapterSettings(BaseModel):
    lora: bool = setting(
        False, "adapters", "Train LoRA adapters instead of all weights (on a model folder or a preset).",
        on_resume=FIXED,
    )
    lora_r: int = setting(16, "adapters", "LoRA rank.", ge=1, on_resume=FIXED)
    lora_alpha: int = setting(32, "adapters", "LoRA alpha.", ge=1, on_resume=FIXED)
    lora_dropout: float = setting(0.05, "adapters", "LoRA dropout.", ge=0, lt=1, on_resume=FREE)
    lora_targets: str = setting(
        "all-linear", "adapters", "What LoRA adapts, comma-separated: all-linear (every linear layer but the head, "
        "and a mixture of experts' routed experts; its router stays frozen), the components attention, experts (the "
        "routed experts' fused weights), shared_experts and router, or module names (q_proj, ...). A word that "
        "adapts nothing, or MLP names that miss a mixture's routed experts, is an error naming the counts.",
        on_resume=FIXED,
    )
    quant: Literal["none", "4bit", "8bit"] = setting(
        "none", "adapters", "Load the base model quantized with bitsandbytes (QLoRA); needs TRAIN_LORA=1.",
        on_resume=FIXED,
    )
    neftune_alpha: float = setting(0.0, "adapters", "NEFTune noise alpha; 0 turns it off.", ge=0, on_resume=FREE)
    trainable: str = setting(
        "projector,language", "adapters", "A vision-language model's parts that train (vision, projector, "
        "language; the rest stays frozen, checked); with TRAIN_LORA=1, LoRA on their linears, the projector whole.",
        on_resume=FIXED,
    )
