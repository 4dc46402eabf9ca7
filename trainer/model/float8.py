"""TRAIN_PRECISION=fp8: the model's linear layers swapped for torchao's Float8Linear (tensorwise dynamic scaling).

The decision (trainer.config.precision.decide_precision) has already checked the GPU (FP8 tensor cores), torchao and
the combination; here the model is converted in place, before torch.compile and the batch search see it. Which layers:
every nn.Linear but the LM head (its logits feed the loss directly, and float8 there costs accuracy where the gain is
one matmul of the step) and layers whose input or output dimension is not a multiple of 16 (float8 matmuls need
both; torch._scaled_mm refuses others). The weights stay fp32 parameters (the optimizer's master weights, what a
checkpoint and final/ hold); each forward casts them and the activations to float8 with one scale per tensor."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("trainer")

FP8_DIM_MULTIPLE = 16  # float8 matmuls (torch._scaled_mm) need both dimensions divisible by 16


def fp8_layer_names(model: Any) -> list[str]:
    """The qualified names of the linear layers TRAIN_PRECISION=fp8 converts (see the module's docstring)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [
        name for name, module in model.named_modules()
        if type(module) is torch.nn.Linear and module is not head
        and module.in_features % FP8_DIM_MULTIPLE == 0 and module.out_features % FP8_DIM_MULTIPLE == 0
    ]  # fmt: skip


def convert_to_fp8(model: Any) -> list[str]:
    """Swap the chosen linear layers for torchao's Float8Linear in place (no forward runs); returns their names."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = set(fp8_layer_names(model))
    convert_to_float8_training(model, config=Float8LinearConfig(), module_filter_fn=lambda _m, fqn: fqn in chosen)
    linears = sum(1 for _ in _linears(model))
    log.info("fp8: %d of %d linear layers multiply in float8 (torchao, tensorwise scaling; the LM head and layers "
             "with a dimension not divisible by %d stay bf16); mfu is bf16-equivalent (the bf16 peak is its "
             "denominator)", len(chosen), linears, FP8_DIM_MULTIPLE)  # fmt: skip
    return sorted(chosen)


def _linears(model: Any) -> Any:
    import torch

    return (m for m in model.modules() if isinstance(m, torch.nn.Linear))
