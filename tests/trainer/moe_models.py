"""Tiny random mixture-of-experts models of each family, built locally from Transformers' config classes (hidden 64,
2 layers, 8 routed experts, top-2), saved as model folders with the byte-level tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

HIDDEN, LAYERS, EXPERTS, TOP_K = 64, 2, 8, 2
FAMILIES = ("qwen3_moe", "gpt_oss", "olmoe", "mixtral", "deepseek_v3")


def tiny_config(family: str, vocab: int = 320) -> Any:
    """A tiny config of `family`: 2 layers of 8 routed experts, top-2 (DeepSeek-V3: its first layer dense, a shared
    expert, two expert groups)."""
    import transformers

    common: dict[str, Any] = {"vocab_size": vocab, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts_per_tok": TOP_K,
                              "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2,
                              "pad_token_id": 0}  # fmt: skip
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
                                           num_experts=EXPERTS)  # fmt: skip
    if family == "gpt_oss":
        return transformers.GptOssConfig(**common, head_dim=16, intermediate_size=32, num_local_experts=EXPERTS,
                                         layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    if family == "olmoe":
        return transformers.OlmoeConfig(**common, intermediate_size=32, num_experts=EXPERTS)
    if family == "mixtral":
        return transformers.MixtralConfig(**common, intermediate_size=32, num_local_experts=EXPERTS)
    if family == "deepseek_v3":
        return transformers.DeepseekV3Config(
            **common, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=EXPERTS, n_shared_experts=1,
            first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=16,
        )  # fmt: skip
    raise ValueError(family)


def tiny_model(family: str, seed: int = 0, **load: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(family), **load)


def save_tiny(family: str, folder: Path, seed: int = 0) -> Path:
    """A model folder (config, safetensors, the byte-level tokenizer) of `family`'s tiny model."""
    from trainer.tokenizer import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    model = tiny_model(family, seed)
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
