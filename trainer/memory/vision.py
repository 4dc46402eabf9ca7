"""The prediction of a vision-language model: its language model's (trainer.memory.predict, from the language model's
shape) and, in the same parts, its vision tower's and projector's weights, gradients and optimizer state and the
image tokens' activations (trainer.memory.vision_shape: the tower and projector of each family).

- Held as trainer.run.training_model.build_vision_model holds them: full fine-tuning keeps every weight in fp32,
  frozen ones too (DeepSpeed: the compute dtype); a LoRA base (the tower, the projector's frozen original) is in the
  compute dtype and the projector's trained copy (PEFT's modules_to_save) in fp32; QLoRA's tower linears in 4-bit,
  the rest of the tower and the projector in fp32 (PEFT's preparation; the projector is never quantized).
- Trained as TRAIN_TRAINABLE says: gradients and optimizer state for the trained parts' tensors (under LoRA the
  tower's adapters and the projector's copy); a frozen language model (TRAIN_TRAINABLE without it) keeps its
  weights and saves what a frozen LoRA base saves.
- Activations: a record's image tokens, at most TRAIN_SEQ_LEN per sequence (an upper bound: how many tokens a
  record's images make is known once they are read). A frozen tower saves nothing (no gradient is asked of it:
  trainer.model.vision_parts.keep_frozen_tower_out_of_backward); a trained one saves per patch and block what its
  attention and MLP save (checkpointed: each block's input, one block recomputed at a time); the projector saves
  its inputs when it or the tower trains.
Tested against the real tensors and saved activations of tiny-vl built as the run builds it
(tests/trainer/test_memory_vision.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from trainer.config.presets import is_preset, is_vision_preset
from trainer.memory.predict import (
    BNB_BLOCK,
    BNB_MIN_8BIT,
    CONTEXT_BYTES,
    FRAGMENTATION,
    NF4_BLOCK,
    NF4_NESTED,
    Plan,
    Prediction,
    bnb_8bit_state,
    predict,
    rows,
    shards,
    tensor_sizes,
)
from trainer.memory.vision_shape import VisionShape, VisionUnknown, folder_vision, preset_vision

if TYPE_CHECKING:
    from trainer.config.run_config import RunConfig

LANGUAGE_PARTS = ("gradients", "optimizer", "activations", "logits_and_loss")  # a frozen language model's own


def vision_of(cfg: RunConfig) -> VisionShape | None:
    """The run's tower and projector; None for a text model, or a family not modelled (`unmodelled` says which)."""
    name = cfg.settings.model
    if is_vision_preset(name):
        return preset_vision(name)
    if is_preset(name):
        return None
    try:
        return folder_vision(cfg.decisions.model.value)
    except VisionUnknown:
        return None


def unmodelled(cfg: RunConfig) -> str | None:
    """What the prediction leaves out of a vision-language model whose family it does not model; None otherwise."""
    if is_preset(cfg.settings.model):
        return None
    try:
        folder_vision(cfg.decisions.model.value)
    except VisionUnknown as exc:
        return (f"the vision tower and projector of {exc} (not modelled: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, "
                "Idefics3/SmolVLM, SmolVLM2 and LLaVA are): the prediction is its language model's")  # fmt: skip
    return None


def predict_model(plan: Plan) -> Prediction:
    """The whole model's prediction: the language model's, with the tower, the projector and the image tokens."""
    v = plan.vision
    if v is None:
        return predict(plan)
    trained = replace(plan, lora_targets=()) if plan.lora and "language" not in plan.trainable else plan
    parts = dict(predict(trained).parts)
    if not plan.lora and "language" not in plan.trainable:  # frozen: saves what a frozen LoRA base saves
        trained = replace(plan, lora=True, lora_targets=())
        parts |= {name: predict(trained).parts[name] for name in LANGUAGE_PARTS}
    kept, recomputed = image_activations(plan, v, rows(plan) * plan.seq_len)
    added = {"weights": weight_bytes(plan, v), "gradients": gradient_bytes(plan, v),
             "optimizer": optimizer_bytes(plan, v, max(tensor_sizes(trained), default=0) >= BNB_MIN_8BIT),
             "activations": kept + recomputed,
             "autocast_copies": autocast_copy_bytes(plan, v)}  # fmt: skip
    for name, value in added.items():
        parts[name] += value
    counted = sum(value for name, value in parts.items() if name not in ("framework", "vllm_colocated"))
    parts["framework"] = CONTEXT_BYTES + int(FRAGMENTATION * counted)
    return Prediction(plan, parts)


def trained_sizes(plan: Plan, v: VisionShape) -> list[int]:
    """The trained tensors of the tower and projector: the tower's (its LoRA adapters under LoRA), the projector's."""
    sizes: list[int] = []
    if "vision" in plan.trainable:
        lora = [size for a, b in v.tower_linears for size in (plan.lora_r * a, plan.lora_r * b)]
        sizes += lora if plan.lora else list(v.tower)
    if "projector" in plan.trainable:
        sizes += list(v.projector)
    return sizes


def quantized_bytes(plan: Plan, linears: tuple[tuple[int, int], ...]) -> int:
    """bitsandbytes' weights of `linears`: 4-bit NF4 with double-quantized absmax, or int8 with an fp32 scale per
    output row (trainer.memory.predict's layouts)."""
    if plan.quant == "4bit":
        blocks = [math.ceil(a * b / NF4_BLOCK) for a, b in linears]
        return sum(a * b for a, b in linears) // 2 + sum(blocks) + sum(math.ceil(n / NF4_NESTED) * 4 for n in blocks)
    return sum(a * b + b * 4 for a, b in linears)


def weight_bytes(plan: Plan, v: VisionShape) -> int:
    c, whole = plan.compute_bytes, v.parameters()
    if plan.quant != "none":  # PEFT's preparation makes all bitsandbytes left whole fp32
        quantized = sum(a * b for a, b in v.tower_linears)
        held = quantized_bytes(plan, v.tower_linears) + (whole - quantized) * 4
    elif plan.lora:
        held = whole * (4 if plan.fsdp != "none" else c)
    else:
        held = whole * (c if plan.zero_stage and plan.fsdp == "none" else 4)
    adapters = sum(trained_sizes(plan, v)) * 4 if plan.lora else 0  # the tower's adapters, the projector's copy
    return (held + adapters) // shards(plan, "weights")


def gradient_bytes(plan: Plan, v: VisionShape) -> int:
    width = plan.compute_bytes if plan.zero_stage else 4
    return sum(trained_sizes(plan, v)) * width // shards(plan, "gradients")


def optimizer_bytes(plan: Plan, v: VisionShape, language_maps: bool) -> int:
    """The optimizer's state of the trained tensors, in trainer.memory.predict's layouts (AdamW's two fp32 states
    and a step count per tensor, bitsandbytes' 8-bit blocks, none for SGD, Adafactor's factored rows and
    columns; DeepSpeed's fp32 master copy; nothing on the GPU when ZeRO offloads it). `language_maps`: the language
    model's prediction holds bitsandbytes' shared quantization maps already."""
    sizes = trained_sizes(plan, v)
    name = plan.optim
    if not sizes or plan.zero_offload != "none":
        return 0
    if "8bit" in name:  # its two quantization maps, shared, where the language model's tensors had none
        state = sum(bnb_8bit_state(n) for n in sizes)
        state += 2 * BNB_BLOCK * 4 if max(sizes) >= BNB_MIN_8BIT and not language_maps else 0
    elif name.startswith("sgd"):
        state = 0
    elif name.startswith("adafactor"):
        state = sum(sizes) // max(v.blocks.width, 1) * 8 + len(sizes) * 4
    else:
        state = sum(sizes) * 8 + len(sizes) * 4
    state += sum(sizes) * 4 if plan.zero_stage else 0
    return state // shards(plan, "optimizer")


def block_bytes_per_patch(plan: Plan, v: VisionShape) -> int:
    """What one of the tower's blocks saves per patch when it trains (counted on the real towers with saved-tensor
    hooks): the two norms' inputs, attention's q, k, v and output (Qwen-VL's rotated q and k too), the linears'
    inputs (qkv's, fc1's, fc2's; Qwen-VL's projection's), the MLP's other intermediate-sized tensors (fc1's output,
    the activation's sigmoid for quick_gelu; a gated MLP's gate, up and product), the norms' fp32 statistics and
    attention's log-sum-exp per head. Under autocast all in the compute dtype (the patch embedding's output is) but
    the norms' inputs where learned fp32 positions keep the residual stream fp32. On a LoRA base the linears save
    no input for their frozen weights; each adapter its dropout's mask and output and A's output."""
    b, c = v.blocks, plan.compute_bytes
    norms = 2 * b.width * (4 if b.fp32_residual else c)
    attention = (6 if b.rotary else 4) * b.width
    mlp = ((3 if b.gated else 1) + (1 if b.quick_gelu else 0)) * b.intermediate
    saved = norms + (attention + mlp) * c + (b.heads + 4) * 4
    if not plan.lora:
        return saved + ((3 if b.rotary else 2) * b.width + b.intermediate) * c
    per_block = max(b.depth, 1)
    inputs, linears = sum(a for a, _ in v.tower_linears) // per_block, len(v.tower_linears) // per_block
    dropout = plan.dropout_mask_bytes + c if plan.lora_dropout else c
    return saved + inputs * dropout + linears * plan.lora_r * c


def image_activations(plan: Plan, v: VisionShape, image_tokens: int) -> tuple[int, int]:
    """(saved by the forward pass, recomputed at once in the backward pass) for `image_tokens` image tokens: the
    trained tower's patch embedding input (the pixels) and blocks over their patches, the projector's inputs where
    a gradient passes through it."""
    kept = recomputed = 0
    if "vision" in plan.trainable:
        patches, b = round(image_tokens * v.patches_per_token), v.blocks
        per_block = patches * block_bytes_per_patch(plan, v)
        if plan.grad_ckpt:
            kept, recomputed = b.depth * patches * b.width * 4, per_block
        else:
            kept = b.depth * per_block
        kept += 0 if plan.lora else patches * v.patch_values * plan.compute_bytes  # a frozen patch embedding's: none
    if "vision" in plan.trainable or "projector" in plan.trainable:
        kept += image_tokens * v.projector_saved * plan.compute_bytes
    return kept, recomputed


def autocast_copy_bytes(plan: Plan, v: VisionShape) -> int:
    """Autocast's compute-dtype copies of the trained fp32 tensors, kept for the backward pass: the tower's linears
    and patch embedding (under LoRA its adapters), the projector's linears (under LoRA PEFT's fp32 copy of it); the
    tower's one block at a time under checkpointing."""
    return sum(tower_and_projector_copies(plan, v)) // shards(plan, "weights")


def tower_and_projector_copies(plan: Plan, v: VisionShape) -> tuple[int, int]:
    if plan.compute_bytes == 4:
        return 0, 0
    tower, depth = 0, max(v.blocks.depth, 1) if plan.grad_ckpt else 1
    if "vision" in plan.trainable and plan.lora:
        tower = sum(plan.lora_r * (a + b) for a, b in v.tower_linears) * 2 // depth
    elif "vision" in plan.trainable:
        tower = sum(a * b for a, b in v.tower_linears) * 2 // depth + v.patch_values * v.blocks.width * 2
    projector = sum(a * b for a, b in v.projector_linears) * 2 if "projector" in plan.trainable else 0
    return tower, projector
