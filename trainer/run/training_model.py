"""The model a run trains: trainer.model builds it (a preset or a folder, LoRA/QLoRA) as the run's settings and
decisions say; here the run places it (build_device), compiles it (regional torch.compile: each decoder layer in
place) and counts its parameters."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainer.config.moe import moe_of
from trainer.config.precision import compute_dtype_name, float8_matmuls
from trainer.config.presets import is_preset
from trainer.config.sharding import uses_fsdp
from trainer.config.speed import compiled_by_accelerate
from trainer.model.adapters import apply_lora
from trainer.model.build import base_weights_dtype
from trainer.model.chunked_loss import install_chunked_loss
from trainer.model.components import param_numel
from trainer.model.float8 import convert_to_fp8
from trainer.model.loading import LoadHow, Weights, load
from trainer.model.packed_attention import implementation, isolate_records

if TYPE_CHECKING:
    from trainer.config.run_config import RunConfig

log = logging.getLogger("trainer")


def build_device(cfg: RunConfig) -> torch.device:
    """Where the model is built: this process's GPU when one trains the whole model (no fp32 host copy to move
    there); the CPU with DeepSpeed or FSDP, which place and shard the model themselves, and on CPU machines."""
    if not cfg.hardware.is_gpu or cfg.deepspeed or cfg.settings.fsdp != "none":
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def load_how(cfg: RunConfig, score_head: bool = False, packed: bool = True) -> LoadHow:
    """How the run loads its model, from its settings and decisions. `packed`: the attention of packed records
    (trainer.model.packed_attention); else the attention decision as Transformers implements it, which reads the
    padding mask: a reward model's padded pairs, a model that also generates (online RL, with its KV cache). The
    reward model (`score_head`) is trained in full (no LoRA, no quantization: config.method refuses them)."""
    s = cfg.settings
    attn, precision = cfg.decisions.attn.value, cfg.decisions.precision.value
    sharded = uses_fsdp(s)  # FSDP places and shards the weights itself
    return LoadHow(
        dtype=base_weights_dtype(s.quant, s.lora, precision, sharded),
        quant=s.quant, quant_type="nf4", double_quant=True, compute=compute_dtype_name(precision), shardable=sharded,
        device=_placement(cfg, s.quant, sharded), attention=implementation(attn) if packed else attn,
        score_head=score_head, rope=s, experts=cfg.decisions.moe_impl.value, dense_experts=True,
    )  # fmt: skip


def _placement(cfg: RunConfig, quant: str, sharded: bool) -> str | int | None:
    """A quantized model goes to this rank's GPU, except under FSDP, which places (and shards) it itself (ZeRO-3
    with quantization is refused at configuration time), and on a machine without one to the CPU (bitsandbytes'
    CPU backend: a GPU index there ended the run in Transformers' loader); other weights are read straight onto
    build_device's GPU."""
    if quant != "none":
        if not cfg.hardware.is_gpu:
            return "cpu"  # trainer.config.adapters.decide_quant checked that bitsandbytes quantizes on the CPU
        return None if sharded else int(os.environ.get("LOCAL_RANK", "0"))
    device = build_device(cfg)
    return str(device) if device.type == "cuda" else None


def _weights(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase) -> Weights:
    if is_preset(cfg.settings.model):
        return Weights(preset=cfg.settings.model, tokenizer=tokenizer)
    return Weights(folder=cfg.decisions.model.value, tokenizer=tokenizer)  # a Hub ID: its snapshot in HF_HOME


def _log_loaded(cfg: RunConfig, model: PreTrainedModel, attn: str) -> None:
    s = cfg.settings
    if is_preset(s.model):
        family = "Llama" if moe_of(model.config) is None else "Qwen3-MoE"
        log.info("model: preset %r from scratch (%s, attention=%s), built on %s", s.model, family, attn, model.device)
        return
    folder = cfg.decisions.model.value
    name = s.model if s.model == folder else f"{s.model} ({folder})"
    log.info("model: loaded %s offline (attention=%s, weights %s on %s)", name, attn, model.dtype, model.device)


def build_model(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase, packed: bool = True) -> PreTrainedModel:
    """The model to train: a preset from scratch or a local folder, with LoRA/quantization applied. `packed`: the
    attention of packed records (trainer.model.packed_attention); False for a model that also generates (online RL):
    Transformers' own attention, which reads the padding mask, with its KV cache."""
    s = cfg.settings
    attn = cfg.decisions.attn.value
    deepspeed_counts_every_process(cfg)
    model = load(_weights(cfg, tokenizer), load_how(cfg, packed=packed))
    _log_loaded(cfg, model, attn)
    if packed:
        isolate_records(model, attn)  # use_cache off; attention never crosses packed records
    if s.lora:
        model = apply_lora(model, s)
    if float8_matmuls(cfg.decisions.precision.value):  # before compile and the batch search: both see the float8 layers
        convert_to_fp8(model)
    if cfg.decisions.cross_entropy.value == "chunked":  # the loss from the head's weight, a chunk at a time
        install_chunked_loss(model)
    compile_model(cfg, model)
    log_parameter_counts(model)
    return model


def build_vision_model(cfg: RunConfig, processor: Any, parts: frozenset[str]) -> PreTrainedModel:
    """A vision-language model to train on records with images: a vision preset from scratch or a folder, with
    Transformers' own attention (records are never packed), `parts` trained (trainer.model.vision_parts: vision,
    projector, language) and every other component frozen; with LoRA, the adapter on the linears of the trained
    parts but the projector, which trains whole. A component left trainable against `parts` exits 2."""
    from trainer.config.presets import is_vision_preset
    from trainer.model.vision_parts import (
        PROJECTOR_MODULES,
        check_frozen,
        keep_frozen_tower_out_of_backward,
        linear_modules,
        outermost_modules,
        set_trainable,
    )

    s = cfg.settings
    deepspeed_counts_every_process(cfg)
    weights = (Weights(preset=s.model, tokenizer=processor.tokenizer) if is_vision_preset(s.model)
               else Weights(folder=cfg.decisions.model.value, tokenizer=processor.tokenizer))  # fmt: skip
    # QLoRA leaves the projector unquantized: it is small, and trained whole where TRAIN_TRAINABLE names it
    model = load(weights, dataclasses.replace(load_how(cfg, packed=False), unquantized=(PROJECTOR_MODULES,)))
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None:
            config.use_cache = False  # training needs no KV cache
    set_trainable(model, frozenset() if s.lora else parts)  # LoRA: the base frozen, its adapter trains
    keep_frozen_tower_out_of_backward(model, parts)
    if s.lora:
        adapted = parts - {"projector"}
        model = apply_lora(model, s, targets=linear_modules(model, adapted),
                           whole=outermost_modules(model, "projector") if "projector" in parts else None)  # fmt: skip
    check_frozen(model, parts, f"TRAIN_TRAINABLE={cfg.settings.trainable}")
    log_parameter_counts(model)
    return model


def deepspeed_counts_every_process(cfg: RunConfig) -> None:
    """ZeRO-3 partitions the weights as they are built (deepspeed.zero.Init) and checks the batch against DeepSpeed's
    own count of processes. On CPUs accelerate starts torch.distributed without DeepSpeed's comm layer, which then
    counts one process and refuses the batch of two; given the started process group, it counts them all (where
    accelerate already gave it one, as on GPUs, this does nothing)."""
    import torch.distributed as dist

    if cfg.deepspeed and dist.is_available() and dist.is_initialized():
        import deepspeed

        deepspeed.init_distributed(dist_backend=dist.get_backend(), verbose=False)


def build_reward_model(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """TRAIN_METHOD=reward's model: the policy's, loaded the same way, with a one-score head."""
    model = load(_weights(cfg, tokenizer), load_how(cfg, score_head=True, packed=False))
    _log_loaded(cfg, model, cfg.decisions.attn.value)
    model.config.pad_token_id = tokenizer.pad_token_id
    log.info("model: %s with a one-score head (reward model)", type(model).__name__)
    compile_model(cfg, model)
    log_parameter_counts(model)
    return model


def compile_model(cfg: RunConfig, model: torch.nn.Module) -> None:
    """torch.compile in place as TRAIN_COMPILE_SCOPE says, where the trainer compiles (not DeepSpeed/FSDP's
    Accelerate)."""
    s = cfg.settings
    if not cfg.decisions.compile.value or compiled_by_accelerate(s):
        return
    if s.compile_scope == "layers":
        compile_layers(model, s.compile_backend, s.compile_mode)
        return
    model.compile(backend=s.compile_backend, mode=s.compile_mode)
    log.info("torch.compile: the whole model's forward (backend %s, mode %s); the first step compiles it",
             s.compile_backend, s.compile_mode)  # fmt: skip


def compile_layers(model: torch.nn.Module, backend: str, mode: str) -> int:
    """torch.compile each decoder layer in place (regional compilation): the layers share one compiled graph (their
    code and shapes are the same; parameters are inputs), so the compile time does not grow with depth; the
    decoder's own forward (the attention mask, the records hook) and the loss stay eager. Returns the layer count."""
    layers = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0)
    for layer in layers:
        layer.compile(backend=backend, mode=mode)
    log.info("torch.compile: %d %s layers compiled in place (backend %s, mode %s); the first step compiles them",
             len(layers), type(layers[0]).__name__, backend, mode)  # fmt: skip
    return len(layers)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts."""
    total = trainable = 0
    for p in model.parameters():
        n = param_numel(p)
        total += n
        if p.requires_grad:
            trainable += n
    return total, trainable


def log_parameter_counts(model: torch.nn.Module) -> None:
    """The parameter counts in the log (the component table follows once the run's record is made:
    trainer.run.kit.learned)."""
    total, trainable = count_parameters(model)
    log.info(
        "parameters: %s total, %s trainable (%.2f%%)", f"{total:,}", f"{trainable:,}", 100 * trainable / max(total, 1)
    )
