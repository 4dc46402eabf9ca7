"""The `tiny-vl` preset: a Qwen2-VL-shaped vision-language model trained from scratch, with nothing downloaded.

Its tokenizer is the byte-level one with Qwen2-VL's chat and vision tokens added, its image processor Qwen2-VL's
Pillow one (no torchvision) bounded to 4-16 image tokens per image, its chat template the built-in `qwen2-vl`
(trainer/assets/chat_templates/qwen2-vl.jinja), and its processor Qwen2-VL's without the video processor
(trainer.model.vision.video_free): what the quickstart-sized demo and the tests train.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.config.presets import (
    PRESET_MAX_POSITIONS,
    PRESET_ROPE_THETA,
    VISION_MERGE,
    VISION_PATCH,
    VISION_PRESETS,
    vision_tower_config,
)

QWEN2_VL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                   "<|video_pad|>")  # fmt: skip
TEMPLATE = Path(__file__).resolve().parents[1] / "assets" / "chat_templates" / "qwen2-vl.jinja"
TOKEN_PIXELS = (VISION_PATCH * VISION_MERGE) ** 2  # the pixels one image token stands for (a 28x28 square)


def add_qwen2_vl_tokens(tokenizer: Any) -> None:
    """Qwen2-VL's chat and vision tokens on a tokenizer that lacks them (the byte-level one), as special tokens."""
    missing = [t for t in QWEN2_VL_TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing})


def qwen2_vl_processor(tokenizer: Any, name: str = "tiny-vl", template: str | None = None) -> Any:
    """Qwen2-VL's processor (without its video processor) on `tokenizer`, its tokens added, the preset's image
    token bounds, and `template` (the built-in qwen2-vl when None)."""
    from transformers import Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from trainer.model.vision import video_free

    p = VISION_PRESETS[name]
    add_qwen2_vl_tokens(tokenizer)
    images = Qwen2VLImageProcessorPil(min_pixels=p.min_image_tokens * TOKEN_PIXELS,
                                      max_pixels=p.max_image_tokens * TOKEN_PIXELS, patch_size=VISION_PATCH,
                                      merge_size=VISION_MERGE)  # fmt: skip
    chat = template or TEMPLATE.read_text(encoding="utf-8")
    tokenizer.chat_template = chat
    return video_free(Qwen2VLProcessor)(image_processor=images, tokenizer=tokenizer, chat_template=chat)


def vision_preset_config(name: str, tokenizer: Any) -> Any:
    """The Qwen2VLConfig of a vision preset for `tokenizer` (its vocabulary rounded up to a multiple of 64)."""
    from transformers import Qwen2VLConfig

    text = VISION_PRESETS[name].language
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN2_VL_TOKENS}
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    head = text.hidden // text.heads  # multimodal RoPE splits half the rotary dimensions over time, height, width
    sections = [head // 8, (head // 2 - head // 8) // 2, head // 2 - head // 8 - (head // 2 - head // 8) // 2]
    language = {"vocab_size": (len(tokenizer) + 63) // 64 * 64, "hidden_size": text.hidden,
                "num_hidden_layers": text.layers, "intermediate_size": text.intermediate,
                "num_attention_heads": text.heads, "num_key_value_heads": text.kv_heads,
                "max_position_embeddings": PRESET_MAX_POSITIONS, "tie_word_embeddings": True,
                "rope_parameters": {"rope_type": "default", "rope_theta": PRESET_ROPE_THETA,
                                    "mrope_section": sections},
                **special}  # fmt: skip
    return Qwen2VLConfig(text_config=language, vision_config=vision_tower_config(name),
                         image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                         vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                         tie_word_embeddings=True, **special)  # fmt: skip
