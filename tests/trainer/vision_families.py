"""Tiny random vision-language models of each family trainkit trains, built from the family's config classes with a
byte-level tokenizer (the family's special tokens added), the family's Pillow image processor (no torchvision) and
the family's chat template (TRL's installed copy where TRL has one), saved as a model folder with its processor.

`save_family(name, folder)` -> folder. Shapes are small (hidden 64, two layers, a two-layer vision tower of 28-56
pixel images) so a few training steps cost about a second each on 2 cores.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.model.vision import video_free
from trainer.tokenizer import BOS, EOS, PAD, byte_level_tokenizer

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "idefics3", "smolvlm", "llava")
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 64, 2, 4, 2, 128
QWEN_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>\\n' }}{% else %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{% if message['role'] == 'assistant' %}</s>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)


def trl_template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def tokenizer_with(tokens: tuple[str, ...] = (), named: dict[str, str] | None = None) -> Any:
    """The byte-level tokenizer with `tokens` added as special tokens and `named` ones as attributes
    (tokenizer.boi_token, ...), as a saved tokenizer keeps them."""
    from transformers import PreTrainedTokenizerFast

    backend = copy.deepcopy(byte_level_tokenizer().backend_tokenizer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                  extra_special_tokens=named or {}, model_max_length=1 << 30)  # fmt: skip
    missing = [t for t in tokens if t not in tok.get_vocab()]
    if missing:
        tok.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    return tok


def _text(tok: Any, **more: Any) -> dict[str, Any]:
    return {"vocab_size": (len(tok) + 63) // 64 * 64, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "intermediate_size": INTERMEDIATE,
            "max_position_embeddings": 1024, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id, **more}  # fmt: skip


def _qwen_ids(tok: Any) -> dict[str, int]:
    return {"image_token_id": tok.convert_tokens_to_ids("<|image_pad|>"),
            "video_token_id": tok.convert_tokens_to_ids("<|video_pad|>"),
            "vision_start_token_id": tok.convert_tokens_to_ids("<|vision_start|>"),
            "vision_end_token_id": tok.convert_tokens_to_ids("<|vision_end|>")}  # fmt: skip


MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}


def _qwen_images(patch: int) -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    side = patch * 2
    return Qwen2VLImageProcessorPil(min_pixels=4 * side * side, max_pixels=16 * side * side, patch_size=patch,
                                    merge_size=2)  # fmt: skip


def qwen2_vl() -> tuple[Any, Any]:
    from trainer.model.vision_preset import qwen2_vl_processor, vision_preset_config

    tok = byte_level_tokenizer()
    processor = qwen2_vl_processor(tok)
    return vision_preset_config("tiny-vl", tok), processor


def qwen2_5_vl() -> tuple[Any, Any]:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLProcessor

    tok = tokenizer_with(QWEN_TOKENS)
    processor = video_free(Qwen2_5_VLProcessor)(image_processor=_qwen_images(14), tokenizer=tok,
                                                chat_template=trl_template("qwen2_5_vl"))  # fmt: skip
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": HIDDEN,
              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
              "fullatt_block_indexes": [1]}  # fmt: skip
    config = Qwen2_5_VLConfig(text_config=_text(tok, rope_parameters=MROPE), vision_config=vision, **_qwen_ids(tok))
    return config, processor


def qwen3_vl() -> tuple[Any, Any]:
    from transformers import Qwen3VLConfig, Qwen3VLProcessor

    tok = tokenizer_with(QWEN_TOKENS)
    processor = video_free(Qwen3VLProcessor)(image_processor=_qwen_images(16), tokenizer=tok,
                                             chat_template=trl_template("qwen3_vl"))  # fmt: skip
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": HIDDEN,
              "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
              "deepstack_visual_indexes": [0]}  # fmt: skip
    text = _text(tok, head_dim=HIDDEN // HEADS, rope_parameters={**MROPE, "mrope_interleaved": True})
    return Qwen3VLConfig(text_config=text, vision_config=vision, **_qwen_ids(tok)), processor


def gemma3() -> tuple[Any, Any]:
    from transformers import Gemma3Config, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tok = tokenizer_with(("<start_of_turn>", "<end_of_turn>"), named)
    images = Gemma3ImageProcessorPil(size={"height": 28, "width": 28}, do_pan_and_scan=False)
    processor = Gemma3Processor(image_processor=images, tokenizer=tok, image_seq_length=4,
                                chat_template=trl_template("gemma3"))  # fmt: skip
    text = _text(tok, head_dim=HIDDEN // HEADS, query_pre_attn_scalar=HIDDEN // HEADS, sliding_window=64)
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 28, "patch_size": 7, "vision_use_head": False}  # fmt: skip  # as Gemma 3's towers
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id,
                          image_token_index=tok.image_token_id)  # fmt: skip
    return config, processor


IDEFICS_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                  *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))  # fmt: skip


def _idefics(config_cls: Any, processor_cls: Any, images_cls: Any, template: str, *tokens: str) -> tuple[Any, Any]:
    """Idefics3's architecture (Idefics3, SmolVLM): a SigLIP tower of 28-pixel tiles, a 56-pixel picture split into
    up to four tiles plus the whole one, each tile a single token after the pixel shuffle."""
    tok = tokenizer_with((*tokens, *IDEFICS_TOKENS))
    images = images_cls(size={"longest_edge": 56}, max_image_size={"longest_edge": 28}, do_image_splitting=True)
    processor = processor_cls(image_processor=images, tokenizer=tok, image_seq_len=1,
                              chat_template=trl_template(template))  # fmt: skip
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 28, "patch_size": 14}  # fmt: skip
    config = config_cls(text_config={"model_type": "llama", **_text(tok)}, vision_config=vision, scale_factor=2,
                        image_token_id=tok.convert_tokens_to_ids("<image>"))  # fmt: skip
    return config, processor


def idefics3() -> tuple[Any, Any]:
    """Idefics3, the architecture of SmolVLM (SmolVLM-256M/500M-Instruct's folders are Idefics3)."""
    from transformers import Idefics3Config, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    return _idefics(Idefics3Config, Idefics3Processor, Idefics3ImageProcessorPil, "idefics3")


def smolvlm() -> tuple[Any, Any]:
    """SmolVLM2 (SmolVLM2-2.2B-Instruct's and SmolVLM2-256M/500M-Video-Instruct's folders): Idefics3's architecture
    under its own classes; its processor needs num2words and builds a video processor (torchvision), left out as
    load_processor leaves it out."""
    from transformers import SmolVLMConfig, SmolVLMProcessor
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    return _idefics(SmolVLMConfig, video_free(SmolVLMProcessor), SmolVLMImageProcessorPil, "smolvlm", "<|im_start|>")


def llava() -> tuple[Any, Any]:
    from transformers import LlavaConfig, LlavaProcessor
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    tok = tokenizer_with(("<image>",))
    images = LlavaImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=14,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=LLAVA_TEMPLATE)  # fmt: skip
    vision = {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": 28, "patch_size": 14, "projection_dim": 32}  # fmt: skip
    config = LlavaConfig(text_config={"model_type": "llama", **_text(tok)}, vision_config=vision,
                         image_token_index=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-1,
                         vision_feature_select_strategy="default")  # fmt: skip
    return config, processor


BUILDERS: dict[str, Callable[[], tuple[Any, Any]]] = {
    "qwen2_vl": qwen2_vl, "qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl, "gemma3": gemma3, "idefics3": idefics3,
    "smolvlm": smolvlm, "llava": llava,
}  # fmt: skip


def build(name: str, seed: int = 0) -> tuple[Any, Any]:
    """(a random model of family `name`, its processor)."""
    from transformers import AutoModelForImageTextToText

    config, processor = BUILDERS[name]()
    torch.manual_seed(seed)
    return AutoModelForImageTextToText.from_config(config), processor


def save_family(name: str, folder: Path, seed: int = 0) -> Path:
    model, processor = build(name, seed)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
