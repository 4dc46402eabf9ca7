"""The TRAIN_* settings of the group "Speed: compile and attention".

Fields only: the group's rules (checks, decisions, its TrainingArguments) live in trainer/config/speed.py;
trainer.config.schema assembles the groups.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trainer.config.schema.fields import FREE, Toggle, setting


class SpeedSettings(BaseModel):
    compile: Toggle = setting(
        "auto", "speed", "torch.compile the model. auto: on for a GPU run of TRAIN_MAX_STEPS -1 (epochs) or at "
        "least 200 steps, on a stack where it is known to work; off on CPU. On vLLM's CPU build the colocated "
        "engine (TRAIN_RL_ENGINE=vllm) compiles only when the model does.",
        on_resume=FREE,
    )
    compile_scope: Literal["layers", "model"] = setting(
        "layers", "speed", "What torch.compile compiles. layers: each decoder layer in place, one compile reused by "
        "all (regional; the shortest compile); model: the whole model's forward, the embeddings, mask and LM head "
        "included (a longer compile that may fuse more).",
        on_resume=FREE,
    )
    compile_backend: str = setting("inductor", "speed", "torch.compile backend.", on_resume=FREE)
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = setting(
        "default", "speed", "torch.compile mode.",
        on_resume=FREE,
    )
    attn: Literal["auto", "sdpa", "flash_attention_2", "flash_attention_4", "eager"] = setting(
        "auto", "speed", "Attention implementation (flash_attention_4: the flash-attn-4 package, Hopper and newer). "
        "auto: the measured best for the GPU generation (trainer.config.speed), else flash_attention_2 when "
        "installed and supported, else sdpa.",
        on_resume=FREE,
    )
    liger: Toggle = setting(
        "auto", "speed", "Liger fused kernels (RMSNorm, SwiGLU, RoPE, fused cross-entropy) through Transformers' "
        "use_liger_kernel; needs liger-kernel and a GPU. auto: on where measured faster (none yet: off).",
        on_resume=FREE,
    )
    cross_entropy: Literal["auto", "full", "chunked"] = setting(
        "auto", "speed", "The loss. full: Transformers' cross-entropy on the whole logits; chunked: logits made a "
        "chunk of trained positions at a time and again in the backward, never whole (SFT on llama, mistral, qwen2 "
        "and qwen3 heads). auto: chunked from a 32,768-row vocabulary, unless Liger computes the loss.",
        on_resume=FREE,
    )
