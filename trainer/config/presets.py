"""The built-in model presets: Llama shapes trained from scratch, tiny-moe (a Qwen3-MoE shape: a mixture of experts),
and vision-language shapes (Qwen2-VL's) for records with images. Anything else in TRAIN_MODEL is a model folder or a
Hub ID. The schema (TRAIN_MODEL's docs), the checks and the decisions take the names from here, the run
(trainer.model.build, trainer.model.vision_preset) the shapes; torch-free."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


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
PRESET_MAX_POSITIONS = 2048  # every preset's max_position_embeddings; longer sequences need TRAIN_ROPE_SCALING
PRESET_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class VisionPreset:
    """A Qwen2-VL shape: its language model (as Preset) and vision tower; images become 4 to 16 tokens each."""

    language: Preset
    vision_depth: int
    vision_dim: int
    vision_heads: int
    min_image_tokens: int = 4
    max_image_tokens: int = 16


# Vision-language presets, for records with images: the byte-level tokenizer with Qwen2-VL's chat and vision tokens,
# Qwen2-VL's Pillow image processor, the built-in qwen2-vl chat template (trainer.model.vision_preset builds them).
VISION_PRESETS: dict[str, VisionPreset] = {
    "tiny-vl": VisionPreset(Preset(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128), vision_depth=2,
                            vision_dim=32, vision_heads=2),
}  # fmt: skip
VISION_PRESET_TYPE, VISION_PRESET_BLOCK = "qwen2_vl", "Qwen2VLDecoderLayer"
VISION_PATCH, VISION_MERGE = 14, 2  # a vision preset's patch side and spatial merge (4 patches per image token)
MODEL_PRESETS = (*PRESETS, *VISION_PRESETS)


def is_preset(name: str) -> bool:
    return name in PRESETS or name in VISION_PRESETS


def is_vision_preset(name: str | None) -> bool:
    return name in VISION_PRESETS


def preset_model_type(name: str) -> str:
    """A preset's config model_type (what the decisions read from a folder's config.json)."""
    return VISION_PRESET_TYPE if is_vision_preset(name) else PRESETS[name].model_type


def folder_model_type(folder: str | Path) -> str | None:
    """A model folder's config.json model_type, read without building the config (None: no readable one)."""
    try:
        found = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return str(found) if found else None


def model_type_of(model: str, folder: str | Path) -> str | None:
    """TRAIN_MODEL's model_type: a preset's own, else its folder's config.json's."""
    return preset_model_type(model) if is_preset(model) else folder_model_type(folder)


def preset_block_class(name: str) -> str:
    """The decoder block a preset is made of (FSDP wraps each)."""
    return VISION_PRESET_BLOCK if is_vision_preset(name) else PRESETS[name].block_class


def language_preset(name: str) -> Preset:
    """A preset's language model shape (a vision preset's without its tower)."""
    return VISION_PRESETS[name].language if is_vision_preset(name) else PRESETS[name]


def vision_tower_config(name: str) -> dict[str, object]:
    """A vision preset's vision_config (Qwen2VLVisionConfig's fields; the preset is of VISION_PRESET_TYPE): what
    trainer.model.vision_preset builds the tower from and the memory prediction counts."""
    p = VISION_PRESETS[name]
    return {"depth": p.vision_depth, "embed_dim": p.vision_dim,
            "hidden_size": p.language.hidden, "num_heads": p.vision_heads, "mlp_ratio": 2, "in_channels": 3,
            "patch_size": VISION_PATCH, "spatial_merge_size": VISION_MERGE, "temporal_patch_size": 2}  # fmt: skip
