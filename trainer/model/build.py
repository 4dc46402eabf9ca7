"""Models: built-in Llama presets with fresh weights, or a local Hugging Face folder loaded offline.

LoRA adapters (peft) and bitsandbytes quantization (QLoRA) are applied here; gradient
checkpointing is switched on by Trainer from `TrainingArguments.gradient_checkpointing`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, PreTrainedTokenizerBase

from trainer.compat import model_dtype_kwargs
from trainer.config.presets import PRESET_MAX_POSITIONS, PRESET_ROPE_THETA, PRESETS
from trainer.model.packed_attention import implementation
from trainer.precision import compute_dtype

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


def load_pretrained(
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


def build_preset(config: LlamaConfig, attn: str, device: torch.device | str) -> PreTrainedModel:
    """A preset with fresh weights, allocated and initialised on `device` (fp32: the master weights)."""
    with torch.device(device):
        dtype = model_dtype_kwargs(torch.float32)
        return AutoModelForCausalLM.from_config(config, attn_implementation=implementation(attn), **dtype)


def quantized_preset(config: LlamaConfig, attn: str, quant: str, precision: str, sharded: bool) -> PreTrainedModel:
    """bitsandbytes quantizes at load time, so a from-scratch preset is saved once and loaded back quantized."""
    fresh = AutoModelForCausalLM.from_config(config, **model_dtype_kwargs(torch.float32))
    with tempfile.TemporaryDirectory(prefix="trainkit-preset-") as tmp:
        fresh.save_pretrained(tmp)
        del fresh
        return load_pretrained(tmp, attn, quant, precision, sharded)
