"""TRAIN_PRECISION's values and the dtype each computes in: the one table (the run, the batch search and export ask
it). Dtypes are named, not torch objects, so torch-free callers (export's command line) import it without torch;
`compute_dtype` maps a name to torch's dtype on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # precision -> torch's dtype name
# fp8 runs bf16 mixed precision (autocast, fp32 master weights) with float8 matmuls in the decoder's linear layers
# (trainer.model.float8): everything else, the attention, the LM head and the loss included, computes as bf16 does.
AUTOCAST = {"fp8": "bf16"}


def autocast_precision(precision: str) -> str:
    """The mixed precision a precision decision runs under (fp8: bf16's autocast; the others: themselves)."""
    return AUTOCAST.get(precision, precision)


def compute_dtype_name(precision: str) -> str:
    """The dtype name a precision decision computes in (bf16, fp16; anything else, e.g. nothing recorded: fp32)."""
    return DTYPE_NAMES.get(autocast_precision(precision), "float32")


def compute_dtype(precision: str) -> torch.dtype:
    """The torch dtype a precision decision computes in."""
    import torch

    return getattr(torch, compute_dtype_name(precision))
