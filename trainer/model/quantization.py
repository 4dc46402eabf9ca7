"""bitsandbytes: the one BitsAndBytesConfig, for training (QLoRA) and for `generate`/`eval --quant`.

The 4-bit compute dtype is the run's (trainer.config.precision) when one is given; otherwise bf16 where this machine
computes it natively (trainer.compat's rule: emulated bf16, as on a T4 or V100, does not count), else fp16.
"""

from __future__ import annotations

from typing import Any

QUANTS = ("none", "8bit", "4bit")
QUANT_TYPES = ("nf4", "fp4")


def native_compute_dtype() -> str:
    """bfloat16 on CPUs and on GPUs with native bf16; float16 on GPUs that would only emulate it."""
    import torch

    from trainer.compat import cuda_bf16_supported

    return "bfloat16" if not torch.cuda.is_available() or cuda_bf16_supported() else "float16"


def bnb_config(quant: str, quant_type: str, double_quant: bool, compute: str | None, shardable: bool = False,
               unquantized: tuple[str, ...] = ()) -> Any:  # fmt: skip
    """BitsAndBytesConfig for `quant` (8bit or 4bit). `compute` names the 4-bit compute dtype (None:
    native_compute_dtype). `shardable`: the 4-bit weights are stored in the compute dtype, so FSDP shards them as it
    shards every other parameter (the default uint8 storage leaves them whole on every rank). `unquantized`: module
    name patterns left as they are besides the LM head (Transformers' own default, which a list replaces)."""
    import torch
    from transformers import BitsAndBytesConfig

    settings: dict[str, Any] = {"load_in_8bit": True}
    if quant == "4bit":
        dtype = getattr(torch, compute or native_compute_dtype())
        settings = {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": quant_type,
            "bnb_4bit_use_double_quant": double_quant,
            "bnb_4bit_compute_dtype": dtype,
        }
        if shardable:
            settings["bnb_4bit_quant_storage"] = dtype
    if unquantized:
        settings["llm_int8_skip_modules"] = [*unquantized, "lm_head"]
    return BitsAndBytesConfig(**settings)
