"""The built-in model presets, trained from scratch: Llama shapes, and tiny-moe, a Qwen3-MoE shape (a mixture of
experts). Anything else in TRAIN_MODEL is a model folder or a Hub ID. The schema (TRAIN_MODEL's docs), the checks
and the decisions take the names from here, the run (trainer.model.build) the shapes; torch-free."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 0  # embedding rows it carries at the least (0: the tokenizer's, rounded up to a multiple of 64)
    experts: int = 0  # routed experts per layer: a Qwen3-MoE shape (0: a dense Llama)
    top_k: int = 0  # routed experts per token
    expert_intermediate: int = 0  # each expert's MLP width
    aux_coef: float = 0.0  # the load-balancing loss's coefficient (Qwen3-MoE's router_aux_loss_coef)

    @property
    def model_type(self) -> str:
        return "qwen3_moe" if self.experts else "llama"

    @property
    def block_class(self) -> str:
        """The decoder block the preset is made of (what FSDP wraps)."""
        return "Qwen3MoeDecoderLayer" if self.experts else "LlamaDecoderLayer"


# Llama shapes. Parameter counts in the names assume a ~32k vocabulary; the byte-level tokenizer
# makes the embeddings tiny, so the logged count is the real one.
PRESETS: dict[str, Preset] = {
    "tiny": Preset(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=688),
    "125m": Preset(hidden=768, layers=12, heads=12, kv_heads=12, intermediate=2048),
    "350m": Preset(hidden=1024, layers=24, heads=16, kv_heads=16, intermediate=2816),
    "1b": Preset(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192),
    # 1b with Llama-3.2-1B's 128,256-row vocabulary, where the LM head and the loss weigh as in the real model
    # (the byte-level tokenizer uses its first rows): what 1b figures at the real vocabulary are measured with.
    "1b-128k": Preset(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128_256),
    # tiny's attention with Qwen3-MoE's MLP: 8 routed experts of width 256 per layer, 2 per token (top-2): about as
    # many parameters active per token as tiny, 2.3 times its parameters in all
    "tiny-moe": Preset(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=688, experts=8, top_k=2,
                       expert_intermediate=256, aux_coef=0.001),
}
MODEL_PRESETS = tuple(PRESETS)
PRESET_MAX_POSITIONS = 2048  # every preset's max_position_embeddings; longer sequences need TRAIN_ROPE_SCALING
PRESET_ROPE_THETA = 10000.0


def is_preset(name: str) -> bool:
    return name in PRESETS
