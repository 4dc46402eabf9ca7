"""Models: built-in Llama presets trained from scratch, or a local Hugging Face folder loaded offline.

LoRA adapters (peft) and bitsandbytes quantization (QLoRA) are applied here; gradient
checkpointing is switched on by Trainer from `TrainingArguments.gradient_checkpointing`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, PreTrainedModel, PreTrainedTokenizerBase

from trainer.compat import model_dtype_kwargs
from trainer.config.presets import PRESET_MAX_POSITIONS, PRESET_ROPE_THETA, PRESETS, is_preset
from trainer.config.rope import scale_rope
from trainer.config.sharding import fsdp_checkpoints_activations, uses_fsdp
from trainer.config.speed import compiled_by_accelerate
from trainer.precision import compute_dtype
from trainer.run.packed_attention import implementation, isolate_records
from trainer.tokenizer import fit_embeddings

if TYPE_CHECKING:
    from trainer.config.run_config import RunConfig
    from trainer.config.schema import TrainSettings

log = logging.getLogger("trainer")


def preset_config(name: str, vocab_size: int, seq_len: int, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    """A LlamaConfig for preset `name`; the vocabulary is rounded up to a multiple of 64 for fast matmuls."""
    p = PRESETS[name]
    return LlamaConfig(
        vocab_size=(vocab_size + 63) // 64 * 64,
        hidden_size=p.hidden,
        intermediate_size=p.intermediate,
        num_hidden_layers=p.layers,
        num_attention_heads=p.heads,
        num_key_value_heads=p.kv_heads,
        max_position_embeddings=PRESET_MAX_POSITIONS,
        rope_theta=PRESET_ROPE_THETA,
        tie_word_embeddings=p.hidden <= 1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _quantization_config(quant: str, precision: str, sharded: bool) -> Any:
    """bitsandbytes settings; under FSDP the 4-bit weights are stored in the compute dtype, so FSDP shards them as
    it shards every other parameter (the default uint8 storage leaves them whole on every rank)."""
    from transformers import BitsAndBytesConfig

    if quant == "4bit":
        storage = {"bnb_4bit_quant_storage": compute_dtype(precision)} if sharded else {}
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype(precision),
            **storage,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def base_weights_dtype(quant: str, lora: bool, precision: str, sharded: bool) -> torch.dtype:
    """The dtype a model folder's weights load in.

    Full fine-tuning keeps fp32 master weights (mixed precision computes in bf16/fp16 under autocast and updates
    fp32 weights). LoRA freezes the base weights: they are only read, so they load in the compute dtype, half the
    memory; PEFT keeps the adapters themselves in fp32 (`autocast_adapter_dtype`). Under FSDP the base stays fp32:
    FSDP flattens a wrapped block's parameters into one tensor of one dtype, and the fp32 adapters share it."""
    if quant != "none" or (lora and not sharded):
        return compute_dtype(precision)
    return torch.float32


def pretrained_kwargs(
    attn: str, quant: str, precision: str, sharded: bool, lora: bool = False, device: torch.device | None = None
) -> dict[str, Any]:
    """from_pretrained's arguments. The weights are read straight onto `device` when it is a GPU (build_device);
    a quantized model is placed on this rank's GPU, except under FSDP, which places (and shards) it itself; ZeRO-3
    with quantization is refused at configuration time."""
    kwargs: dict[str, Any] = {"local_files_only": True, "attn_implementation": implementation(attn)}
    kwargs.update(model_dtype_kwargs(base_weights_dtype(quant, lora, precision, sharded)))
    if quant != "none":
        kwargs["quantization_config"] = _quantization_config(quant, precision, sharded)
        if not sharded:
            kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
    elif device is not None and device.type == "cuda":
        kwargs["device_map"] = {"": device.index or 0}
    return kwargs


def _load_pretrained(
    path: str,
    attn: str,
    quant: str,
    precision: str,
    sharded: bool,
    lora: bool = False,
    device: torch.device | None = None,
    config: Any = None,
) -> PreTrainedModel:
    kwargs = pretrained_kwargs(attn, quant, precision, sharded, lora, device)
    if config is not None:
        kwargs["config"] = config
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def build_device(cfg: Any) -> torch.device:
    """Where the model is built: this process's GPU when one trains the whole model (no fp32 host copy to move
    there); the CPU with DeepSpeed or FSDP, which place and shard the model themselves, and on CPU machines."""
    if not cfg.hardware.is_gpu or cfg.deepspeed or cfg.settings.fsdp != "none":
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def build_preset(config: LlamaConfig, attn: str, device: torch.device | str) -> PreTrainedModel:
    """A preset with fresh weights, allocated and initialised on `device` (fp32: the master weights)."""
    with torch.device(device):
        dtype = model_dtype_kwargs(torch.float32)
        return AutoModelForCausalLM.from_config(config, attn_implementation=implementation(attn), **dtype)


def build_model(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The model to train: a preset from scratch or a local folder, with LoRA/quantization applied."""
    s = cfg.settings
    attn = cfg.decisions.attn.value
    precision = cfg.decisions.precision.value
    sharded = uses_fsdp(s)  # FSDP places and shards the weights itself
    device = build_device(cfg)
    if is_preset(s.model):
        config = scale_rope(preset_config(s.model, len(tokenizer), s.seq_len, tokenizer), s)
        if s.quant != "none":
            model = _quantized_preset(config, attn, s.quant, precision, sharded)
        else:
            model = build_preset(config, attn, device)
        log.info("model: preset %r from scratch (Llama, attention=%s), built on %s", s.model, attn, model.device)
    else:
        folder = cfg.decisions.model.value  # a Hub ID's snapshot in HF_HOME (trainer.hub.sources)
        config = scale_rope(AutoConfig.from_pretrained(folder, local_files_only=True), s)
        model = _load_pretrained(folder, attn, s.quant, precision, sharded, s.lora, device, config)
        name = s.model if s.model == folder else f"{s.model} ({folder})"
        log.info("model: loaded %s offline (attention=%s, weights %s on %s)", name, attn, model.dtype, model.device)
        fit_embeddings(model, tokenizer)
    isolate_records(model, attn)  # use_cache off; attention never crosses packed records
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


def _quantized_preset(config: LlamaConfig, attn: str, quant: str, precision: str, sharded: bool) -> PreTrainedModel:
    """bitsandbytes quantizes at load time, so a from-scratch preset is saved once and loaded back quantized."""
    fresh = AutoModelForCausalLM.from_config(config, **model_dtype_kwargs(torch.float32))
    with tempfile.TemporaryDirectory(prefix="trainkit-preset-") as tmp:
        fresh.save_pretrained(tmp)
        del fresh
        return _load_pretrained(tmp, attn, quant, precision, sharded)


def apply_lora(model: PreTrainedModel, s: TrainSettings) -> PreTrainedModel:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if s.quant != "none":
        checkpointing = s.grad_ckpt and not fsdp_checkpoints_activations(s)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
    elif s.grad_ckpt:
        # Frozen embeddings produce no grad; checkpointed blocks need an input that requires one.
        model.enable_input_require_grads()
    targets: Any = s.lora_targets
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    lora = LoraConfig(
        r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    log.info("LoRA: r=%d alpha=%d dropout=%g targets=%s", s.lora_r, s.lora_alpha, s.lora_dropout, s.lora_targets)
    return get_peft_model(model, lora)  # its adapters are fp32 on a bf16/fp16 base (autocast_adapter_dtype)


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
