"""The built-in model presets: Llama shapes trained from scratch, and vision-language shapes (Qwen2-VL's) for records
with images. Anything else in TRAIN_MODEL is a model folder or a Hub ID. The schema (TRAIN_MODEL's docs), the checks
and the decisions take the names from here, the run (trainer.model.build, trainer.model.vision_preset) the shapes;
torch-free."""

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
}
PRESET_MAX_POSITIONS = 2048  # every preset's max_position_embeddings; longer sequences need TRAIN_ROPE_SCALING
PRESET_ROPE_THETA = 10000.0
PRESET_BLOCK_CLASS = "LlamaDecoderLayer"  # the decoder block every Llama preset is made of


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
MODEL_PRESETS = (*PRESETS, *VISION_PRESETS)


def is_preset(name: str) -> bool:
    return name in PRESETS or name in VISION_PRESETS


def is_vision_preset(name: str | None) -> bool:
    return name in VISION_PRESETS


def preset_model_type(name: str) -> str:
    """A preset's config model_type (what the decisions read from a folder's config.json)."""
    return VISION_PRESET_TYPE if is_vision_preset(name) else "llama"


def preset_block_class(name: str) -> str:
    """The decoder block a preset is made of (FSDP wraps each)."""
    return VISION_PRESET_BLOCK if is_vision_preset(name) else PRESET_BLOCK_CLASS


def language_preset(name: str) -> Preset:
    """A preset's language model shape (a vision preset's without its tower)."""
    return VISION_PRESETS[name].language if is_vision_preset(name) else PRESETS[name]
