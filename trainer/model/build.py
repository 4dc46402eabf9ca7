"""What a model is made of before it is loaded: the presets' shapes, and the dtype a run loads a model folder in.

LoRA adapters (trainer.model.adapters) and bitsandbytes quantization (trainer.model.quantization) are applied by
trainer.model.loading; gradient checkpointing is switched on by Trainer from
`TrainingArguments.gradient_checkpointing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.config.precision import compute_dtype_name
from trainer.config.presets import PRESET_MAX_POSITIONS, PRESET_ROPE_THETA, PRESETS

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def preset_config(name: str, vocab_size: int, seq_len: int, tokenizer: Any) -> PretrainedConfig:
    """The config of preset `name`: a LlamaConfig, or a Qwen3MoeConfig for a mixture of experts (tiny-moe); the
    vocabulary (the preset's own where it carries a larger one) is rounded up to a multiple of 64 for fast matmuls."""
    p = PRESETS[name]
    shape = {
        "vocab_size": (max(vocab_size, p.vocab) + 63) // 64 * 64,
        "hidden_size": p.hidden,
        "intermediate_size": p.intermediate,
        "num_hidden_layers": p.layers,
        "num_attention_heads": p.heads,
        "num_key_value_heads": p.kv_heads,
        "max_position_embeddings": PRESET_MAX_POSITIONS,
        "rope_theta": PRESET_ROPE_THETA,
        "tie_word_embeddings": p.hidden <= 1024,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if p.experts:
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(**shape, head_dim=p.hidden // p.heads, num_experts=p.experts, num_experts_per_tok=p.top_k,
                              moe_intermediate_size=p.expert_intermediate, router_aux_loss_coef=p.aux_coef)  # fmt: skip
    from transformers import LlamaConfig

    return LlamaConfig(**shape)


def base_weights_dtype(quant: str, lora: bool, precision: str, sharded: bool) -> str:
    """The dtype name a run loads a model folder's weights in.

    Full fine-tuning keeps fp32 master weights (mixed precision computes in bf16/fp16 under autocast and updates
    fp32 weights). LoRA freezes the base weights: they are only read, so they load in the compute dtype, half the
    memory; PEFT keeps the adapters themselves in fp32 (`autocast_adapter_dtype`). Under FSDP the base stays fp32:
    FSDP flattens a wrapped block's parameters into one tensor of one dtype, and the fp32 adapters share it."""
    if quant != "none" or (lora and not sharded):
        return compute_dtype_name(precision)
    return "float32"
