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
        # its YaRN scaling (factor 32 over 4,096 positions) wants 131,072 positions, or Transformers warns
        return transformers.GptOssConfig(**{**common, "max_position_embeddings": 131_072}, head_dim=16,
                                         intermediate_size=32, num_local_experts=EXPERTS,
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


def save_mxfp4(folder: Path) -> dict[str, Any]:
    """gpt-oss's tiny model saved as gpt-oss checkpoints are: its experts in MXFP4 (per 32 inputs one power-of-two
    scale, stored as its exponent + 127, and 4-bit e2m1 values packed two a byte), `quantization_config` naming
    mxfp4. Returns what Transformers' own dequantization of those blocks gives, by parameter name."""
    import json

    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

    save_tiny("gpt_oss", folder)
    weights = load_file(str(folder / "model.safetensors"))
    values = torch.tensor(FP4_VALUES)
    stored, dense = {}, {}
    for name, w in weights.items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            stored[name] = w
            continue
        rows = w.float().transpose(1, 2).reshape(w.shape[0], w.shape[2], w.shape[1] // 32, 32)  # [E, out, groups, 32]
        exponent = torch.ceil(torch.log2(rows.abs().amax(-1).clamp(min=1e-30) / 6.0)).clamp(-127, 127)
        scaled = rows / torch.ldexp(torch.ones(()), exponent.int())[..., None]
        index = (scaled[..., None] - values).abs().argmin(-1).to(torch.uint8)
        blocks, scales = index[..., 0::2] | (index[..., 1::2] << 4), (exponent + 127).to(torch.uint8)
        stored[f"{name}_blocks"], stored[f"{name}_scales"] = blocks, scales
        dense[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    save_file(stored, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return dense
