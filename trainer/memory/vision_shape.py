"""What the memory prediction knows of a vision-language model's vision tower and projector, torch-free: the size of
every tensor (the weights, gradients and optimizer state follow them), the (in, out) of every linear layer (LoRA's
adapters on the tower, bitsandbytes' 4-bit weights), the tower's blocks (what they save per patch when the tower
trains), how many of the tower's patches make one image token of the language model and what the projector saves
per image token. From a vision preset or a model folder's config.json, family by family: Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, Gemma 3 (a SigLIP tower), Idefics3 / SmolVLM and SmolVLM2 (SigLIP), LLaVA (CLIP or SigLIP); tested equal to
the built models' parameters (tests/trainer/test_vision_families.py). Another family is VisionUnknown, naming it: the
prediction is then its language model's, and says what it leaves out.

Fields a config.json leaves out take Transformers' defaults for that family (written here, as the config classes
have them: config.json holds only what differs at its top level).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config.presets import VISION_PRESET_TYPE, vision_tower_config


class VisionUnknown(ValueError):
    """A vision-language family whose tower and projector the prediction does not model (its message names it)."""


@dataclass(frozen=True)
class Blocks:
    """The tower's transformer blocks: what their activations follow."""

    depth: int
    width: int
    intermediate: int
    heads: int
    gated: bool  # a gated MLP (gate, up, down: Qwen2.5-VL), else fc1 and fc2
    rotary: bool = False  # rotary positions in attention (Qwen-VL's): q and k saved again, rotated
    fp32_residual: bool = False  # learned fp32 positions added to the patches keep the residual fp32 under autocast
    quick_gelu: bool = False  # x * sigmoid(1.702 x), which saves its sigmoid too (CLIP's and Qwen2-VL's MLP)


@dataclass
class Tensors:
    """A part's tensors as they are added: each tensor's size, each linear layer's (in, out)."""

    sizes: list[int] = field(default_factory=list)
    linears: list[tuple[int, int]] = field(default_factory=list)

    def tensor(self, *sizes: int) -> None:
        self.sizes += sizes

    def linear(self, inputs: int, outputs: int, bias: bool = True) -> None:
        self.sizes += [inputs * outputs, *([outputs] if bias else [])]
        self.linears.append((inputs, outputs))

    def norm(self, width: int, bias: bool = True) -> None:
        self.sizes += [width, *([width] if bias else [])]


@dataclass(frozen=True)
class VisionShape:
    family: str  # the model's model_type
    tower: tuple[int, ...]
    tower_linears: tuple[tuple[int, int], ...]
    projector: tuple[int, ...]
    projector_linears: tuple[tuple[int, int], ...]
    blocks: Blocks
    patches_per_token: float  # the tower's positions behind one image token of the language model
    patch_values: int  # pixel values per patch: the patch embedding's input, saved for its weight's gradient
    projector_saved: int  # values the projector saves per image token for the backward pass (its inputs' widths)

    def parameters(self) -> int:
        return sum(self.tower) + sum(self.projector)


def block(into: Tensors, b: Blocks, fused_qkv: bool, layernorm: bool) -> None:
    """One pre-norm transformer block of the tower: attention (q, k, v fused or apart, the output projection, with
    biases), the MLP (with biases), two norms."""
    e, i = b.width, b.intermediate
    into.norm(e, layernorm)
    if fused_qkv:
        into.linear(e, 3 * e)
    else:
        for _ in range(3):
            into.linear(e, e)
    into.linear(e, e)
    into.norm(e, layernorm)
    for inputs, outputs in ([(e, i), (e, i), (i, e)] if b.gated else [(e, i), (i, e)]):
        into.linear(inputs, outputs)


def merger(into: Tensors, width: int, merge: int, out: int, layernorm: bool, merged_norm: bool = False) -> None:
    """Qwen-VL's patch merger: a norm (over one patch, or the merged patches), then an MLP from merge x merge patches
    to one token of the language model."""
    merged = width * merge * merge
    into.norm(merged if merged_norm else width, layernorm)
    into.linear(merged, merged)
    into.linear(merged, out)


def qwen_vl(family: str, v: dict[str, Any], c: dict[str, Any]) -> VisionShape:
    """Qwen2-VL, Qwen2.5-VL and Qwen3-VL: a Conv3d patch embedding over (temporal x patch x patch) pixels, blocks
    with a fused qkv, the merger (and Qwen3-VL's deepstack mergers) in the projector."""
    old = family == "qwen2_vl"
    width = int(v.get("embed_dim", 1280)) if old else int(v.get("hidden_size", {"qwen2_5_vl": 1280}.get(family, 1152)))
    intermediate = (int(width * v.get("mlp_ratio", 4)) if old
                    else int(v.get("intermediate_size", {"qwen2_5_vl": 3420}.get(family, 4304))))  # fmt: skip
    out = int(v.get("hidden_size", 3584)) if old else int(v.get("out_hidden_size", 3584))
    b = Blocks(int(v.get("depth", 32 if family != "qwen3_vl" else 27)), width, intermediate,
               int(v.get("num_heads", 16)), gated=family == "qwen2_5_vl", rotary=True,
               quick_gelu=v.get("hidden_act", "quick_gelu" if old else "") == "quick_gelu")  # fmt: skip
    patch, merge = int(v.get("patch_size", 14 if family != "qwen3_vl" else 16)), int(v.get("spatial_merge_size", 2))
    tower, projector = Tensors(), Tensors()
    layernorm = family != "qwen2_5_vl"  # Qwen2.5-VL's norms are RMSNorms
    values = int(v.get("in_channels", 3)) * int(v.get("temporal_patch_size", 2)) * patch * patch
    tower.tensor(values * width)
    if family == "qwen3_vl":
        tower.tensor(width, int(v.get("num_position_embeddings", 2304)) * width)  # the conv's bias, positions
    for _ in range(b.depth):
        block(tower, b, fused_qkv=True, layernorm=layernorm)
    merger(projector, width, merge, out, layernorm)
    deepstack = len(v.get("deepstack_visual_indexes", [8, 16, 24])) if family == "qwen3_vl" else 0
    for _ in range(deepstack):
        merger(projector, width, merge, out, layernorm, merged_norm=True)
    return shape_of(family, tower, projector, b, merge * merge, values, (1 + deepstack) * 4 * width * merge * merge)


def shape_of(family: str, tower: Tensors, projector: Tensors, b: Blocks, patches_per_token: float, patch_values: int,
             projector_saved: int) -> VisionShape:  # fmt: skip
    return VisionShape(family, tuple(tower.sizes), tuple(tower.linears), tuple(projector.sizes),
                       tuple(projector.linears), b, patches_per_token, patch_values, projector_saved)  # fmt: skip


def vit_tower(v: dict[str, Any]) -> tuple[Tensors, Blocks, int]:
    """A SigLIP (Gemma 3, Idefics3) or CLIP (LLaVA) tower: a Conv2d patch embedding, learned positions, blocks with
    q, k and v apart, a final norm (CLIP's a first one and a class embedding too; SigLIP's its pooling head where
    vision_use_head says), and the pixel values per patch."""
    kind = v.get("model_type", "clip_vision_model")
    if kind not in ("clip_vision_model", "siglip_vision_model", "idefics3_vision", "smolvlm_vision"):
        raise VisionUnknown(f"its vision tower ({kind})")
    clip = kind == "clip_vision_model"
    width, intermediate = int(v.get("hidden_size", 768)), int(v.get("intermediate_size", 3072))
    b = Blocks(int(v.get("num_hidden_layers", 12)), width, intermediate, int(v.get("num_attention_heads", 12)),
               gated=False, fp32_residual=True,
               quick_gelu=v.get("hidden_act", "quick_gelu" if clip else "") == "quick_gelu")  # fmt: skip
    patch, side = int(v.get("patch_size", 32 if clip else 16)), int(v.get("image_size", 224))
    positions = (side // patch) ** 2 + (1 if clip else 0)  # CLIP's class position
    tower, values = Tensors(), int(v.get("num_channels", 3)) * patch * patch
    tower.tensor(values * width)
    tower.tensor(*([width] if clip else []), width * positions, *(() if clip else (width,)))  # class or conv bias
    if clip:
        tower.norm(width)  # pre_layrnorm
    for _ in range(b.depth):
        block(tower, b, fused_qkv=False, layernorm=True)
    tower.norm(width)
    if kind == "siglip_vision_model" and v.get("vision_use_head", True):  # the attention-pooling head
        tower.tensor(width, 3 * width * width, 3 * width)
        tower.linear(width, width)
        tower.norm(width)
        tower.linear(width, intermediate)
        tower.linear(intermediate, width)
    return tower, b, values


def gemma3(v: dict[str, Any], c: dict[str, Any]) -> VisionShape:
    """Gemma 3: SigLIP's patches pooled to mm_tokens_per_image tokens, an RMSNorm and one projection matrix."""
    tower, b, values = vit_tower({"model_type": "siglip_vision_model", "image_size": 896, "patch_size": 14, **v})
    out = int(c.get("text_config", {}).get("hidden_size", 2304))
    projector = Tensors()
    projector.tensor(b.width * out, b.width)
    patches = (int(v.get("image_size", 896)) // int(v.get("patch_size", 14))) ** 2
    per_token = max(1, patches // int(c.get("mm_tokens_per_image", 256)))
    return shape_of("gemma3", tower, projector, b, per_token, values, 2 * b.width)


def idefics3(v: dict[str, Any], c: dict[str, Any], family: str = "idefics3") -> VisionShape:
    """Idefics3 (SmolVLM) and SmolVLM2 (`smolvlm`, the same architecture and defaults under its own classes):
    SigLIP's patches shuffled scale x scale into one token, one linear without bias."""
    tower, b, values = vit_tower({"model_type": f"{family}_vision", "patch_size": 32, **v})
    scale = int(c.get("scale_factor", 2))
    projector = Tensors()
    projector.linear(b.width * scale * scale, int(c.get("text_config", {}).get("hidden_size", 4096)), bias=False)
    return shape_of(family, tower, projector, b, scale * scale, values, b.width * scale * scale)


def llava(v: dict[str, Any], c: dict[str, Any]) -> VisionShape:
    """LLaVA: a CLIP (or SigLIP) tower, a patch per image token, two linears from the selected layers' features."""
    tower, b, values = vit_tower({"model_type": "clip_vision_model", "image_size": 336, "patch_size": 14,
                          "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                          "num_attention_heads": 16, **v})  # fmt: skip
    layers = c.get("vision_feature_layer", -2)
    features = b.width * (len(layers) if isinstance(layers, list) else 1)
    out, bias = int(c.get("text_config", {}).get("hidden_size", 4096)), bool(c.get("multimodal_projector_bias", True))
    projector = Tensors()
    projector.linear(features, out, bias)
    projector.linear(out, out, bias)
    patches = (int(v.get("image_size", 336)) // int(v.get("patch_size", 14))) ** 2
    tokens = patches + (1 if c.get("vision_feature_select_strategy", "default") == "full" else 0)
    return shape_of("llava", tower, projector, b, (patches + 1) / tokens, values, features + 2 * out)  # CLIP's class


FAMILIES: dict[str, Callable[[dict[str, Any], dict[str, Any]], VisionShape]] = {
    "qwen2_vl": lambda v, c: qwen_vl("qwen2_vl", v, c),
    "qwen2_5_vl": lambda v, c: qwen_vl("qwen2_5_vl", v, c),
    "qwen3_vl": lambda v, c: qwen_vl("qwen3_vl", v, c),
    "gemma3": gemma3,
    "idefics3": idefics3,
    "smolvlm": lambda v, c: idefics3(v, c, "smolvlm"),
    "llava": llava,
}  # fmt: skip


def config_vision(c: dict[str, Any]) -> VisionShape | None:
    """The tower and projector of a model config (config.json's content); None for a model without a vision tower,
    VisionUnknown for a family not modelled here."""
    v = c.get("vision_config")
    if not isinstance(v, dict):
        return None
    family = str(c.get("model_type"))
    if family not in FAMILIES:
        raise VisionUnknown(f"the {family} family")
    try:
        return FAMILIES[family](v, c)
    except VisionUnknown as exc:
        raise VisionUnknown(f"the {family} family with {exc}") from None


def folder_vision(folder: str | Path) -> VisionShape | None:
    """A model folder's tower and projector (config_vision of its config.json); None where it has none or no
    readable config.json (the language model's prediction says why)."""
    try:
        c = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config_vision(c) if isinstance(c, dict) else None


def preset_vision(name: str) -> VisionShape:
    """A vision preset's tower and projector, as trainer.model.vision_preset builds them."""
    return FAMILIES[VISION_PRESET_TYPE](vision_tower_config(name), {})
