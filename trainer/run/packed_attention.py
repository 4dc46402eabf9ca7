"""Attention that stays inside each packed record (trainer.data.packing), on every row's stack.

Items of packed records carry `position_ids` restarting at 0 on each record (trainer.data.dataset). From them:
- sdpa/eager on transformers 5: Transformers builds a mask per record itself, but only without a KV cache (with
  one it skips the detection and the records attend to each other), so the decoder runs with use_cache=False.
- sdpa/eager on transformers 4.x (4.46; 4.57 on torch < 2.6): no such detection. The decoder's forward pre-hook
  turns the position ids into a 4D additive causal mask, block-diagonal per record, which these versions take as is.
- flash_attention_2 (every row): the varlen kernel reads records from position ids only for a batch of one row,
  so the collator concatenates a batch's sequences into one row (Transformers' padding-free layout).
Training never needs a cache, so use_cache is off in every case; the model's saved config is left as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from trainer.compat import stack

log = logging.getLogger("trainer")

FLASH = "flash_attention_2"


def isolate_records(model: Any, attn: str) -> None:
    """Hook the decoder (the model's base, under any LoRA/FSDP wrapper added later): no cache, and on stacks that do
    not find records in position ids, a per-record mask."""
    block_mask = attn != FLASH and not stack().packs_by_position_ids
    decoder = getattr(model, "base_model", model)
    decoder.register_forward_pre_hook(_decoder_hook(block_mask), with_kwargs=True)
    how = ("a per-record 4D attention mask (this transformers finds no records in position ids)" if block_mask
           else "one row per batch for flash-attention's varlen kernel" if attn == FLASH
           else "position ids (Transformers' packed-sequence masks)")  # fmt: skip
    log.info("model: use_cache off for training; packed records are kept apart by %s", how)


def _decoder_hook(block_mask: bool) -> Callable[..., Any]:
    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        kwargs["use_cache"] = False
        positions = kwargs.get("position_ids")
        if block_mask and positions is not None and kwargs.get("attention_mask") is None:
            dtype = module.get_input_embeddings().weight.dtype
            kwargs["attention_mask"] = record_mask(positions, dtype)
        return args, kwargs

    return hook


def record_mask(positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[batch, 1, L, L] additive mask: 0 where a token may attend (same record, not later), the dtype's min elsewhere.
    A record starts wherever the position does not follow the previous one."""
    positions = positions.reshape(-1, positions.shape[-1])
    record = (torch.diff(positions, dim=-1, prepend=positions[:, :1] - 1) != 1).cumsum(-1)
    length = positions.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=positions.device).tril()
    allowed = (record[:, :, None] == record[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def collator_for(attn: str) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """The training DataLoader's collator: Transformers' default one; for flash-attention, packed records in one row."""
    from transformers import default_data_collator

    return one_row_collator if attn == FLASH else default_data_collator


def one_row_collator(features: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch of packed sequences as one row [1, batch x seq_len] (position ids say where each record starts)."""
    from transformers import default_data_collator

    batch = default_data_collator(features)
    if "position_ids" in batch:
        for key in ("input_ids", "labels", "position_ids"):
            batch[key] = batch[key].reshape(1, -1)
    return batch
