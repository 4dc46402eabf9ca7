"""The model a run trains: trainer.model builds it (a preset or a folder, LoRA/QLoRA) as the run's settings and
decisions say; here the run places it (build_device), compiles it (regional torch.compile: each decoder layer in
place) and counts its parameters."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, PreTrainedModel, PreTrainedTokenizerBase

from trainer.config.presets import is_preset
from trainer.config.rope import scale_rope
from trainer.config.sharding import uses_fsdp
from trainer.config.speed import compiled_by_accelerate
from trainer.model.adapters import apply_lora
from trainer.model.build import build_preset, load_pretrained, preset_config, quantized_preset
from trainer.model.packed_attention import isolate_records
from trainer.tokenizer import fit_embeddings

if TYPE_CHECKING:
    from trainer.config.run_config import RunConfig

log = logging.getLogger("trainer")


def build_device(cfg: Any) -> torch.device:
    """Where the model is built: this process's GPU when one trains the whole model (no fp32 host copy to move
    there); the CPU with DeepSpeed or FSDP, which place and shard the model themselves, and on CPU machines."""
    if not cfg.hardware.is_gpu or cfg.deepspeed or cfg.settings.fsdp != "none":
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def build_model(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase, packed: bool = True) -> PreTrainedModel:
    """The model to train: a preset from scratch or a local folder, with LoRA/quantization applied. `packed`: the
    attention of packed records (trainer.model.packed_attention); False for a model that also generates (online RL):
    Transformers' own attention, which reads the padding mask, with its KV cache."""
    s = cfg.settings
    attn = cfg.decisions.attn.value
    precision = cfg.decisions.precision.value
    sharded = uses_fsdp(s)  # FSDP places and shards the weights itself
    device = build_device(cfg)
    if is_preset(s.model):
        config = scale_rope(preset_config(s.model, len(tokenizer), s.seq_len, tokenizer), s)
        if s.quant != "none":
            model = quantized_preset(config, attn, s.quant, precision, sharded)
        else:
            model = build_preset(config, attn, device)
        log.info("model: preset %r from scratch (Llama, attention=%s), built on %s", s.model, attn, model.device)
    else:
        folder = cfg.decisions.model.value  # a Hub ID's snapshot in HF_HOME (trainer.hub.sources)
        config = scale_rope(AutoConfig.from_pretrained(folder, local_files_only=True), s)
        model = load_pretrained(folder, attn, s.quant, precision, sharded, s.lora, device, config)
        name = s.model if s.model == folder else f"{s.model} ({folder})"
        log.info("model: loaded %s offline (attention=%s, weights %s on %s)", name, attn, model.dtype, model.device)
        fit_embeddings(model, tokenizer)
    if packed:
        isolate_records(model, attn)  # use_cache off; attention never crosses packed records
    elif model.config._attn_implementation != attn:
        model.set_attn_implementation(attn)  # trainkit's mask-free causal sdpa would attend to left padding
    if s.lora:
        model = apply_lora(model, s)
    compile_model(cfg, model)
    log_parameter_counts(model)
    return model


def compile_model(cfg: RunConfig, model: torch.nn.Module) -> None:
    """torch.compile in place as TRAIN_COMPILE_SCOPE says, where the trainer compiles (not DeepSpeed/FSDP's
    Accelerate)."""
    s = cfg.settings
    if not cfg.decisions.compile.value or compiled_by_accelerate(s, cfg.deepspeed):
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
    from trainer.run.metrics import param_numel

    total = trainable = 0
    for p in model.parameters():
        n = param_numel(p)
        total += n
        if p.requires_grad:
            trainable += n
    return total, trainable


def log_parameter_counts(model: torch.nn.Module) -> None:
    total, trainable = count_parameters(model)
    log.info(
        "parameters: %s total, %s trainable (%.2f%%)", f"{total:,}", f"{trainable:,}", 100 * trainable / max(total, 1)
    )
