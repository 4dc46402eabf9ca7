"""Attention that is causal on plain text and stays inside each packed record (trainer.data.packing), on every
row's stack.

Items of packed records carry `position_ids` restarting at 0 on each record (trainer.data.dataset); plain-text
items carry none. Training never needs a KV cache, so use_cache is off; the model's saved config is left as is.
- sdpa on transformers 5: the model is built with `CAUSAL_SDPA`, Transformers' own sdpa function registered under
  a name that has no mask builder, so Transformers never builds a mask: its packed-sequence detection (with
  use_cache off) would otherwise build a dense [B,1,L,L] mask for every batch under torch.compile (the detection
  cannot be skipped while tracing) and cost a host sync per forward in eager mode. A plain-text batch reaches SDPA
  with no mask and is_causal=True (the causal flash/cuDNN kernels); for a batch of packed records the decoder's
  forward pre-hook turns the position ids into a boolean block-diagonal causal mask.
- eager (and flex_attention) on transformers 5: Transformers builds a mask per record from the position ids
  itself (only without a cache, hence use_cache off).
- sdpa/eager on transformers 4.x (4.46; 4.57 on torch < 2.6): no such detection. The hook turns the position ids
  into a 4D additive causal mask, block-diagonal per record, which these versions take as is.
- flash-attention 2/3/4: the collator concatenates a batch's sequences into one row (Transformers' padding-free
  layout) and, on transformers 5, gives the varlen kernel the records' boundaries (cu_seq_lens_q/k, max_length_q/k)
  computed on the host; 4.x's flash-attention 2 reads them from the one row's position ids.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from trainer.compat import stack

log = logging.getLogger("trainer")

FLASH_FAMILY = frozenset({"flash_attention_2", "flash_attention_3", "flash_attention_4"})  # one flash path in 5.x
CAUSAL_SDPA = "trainkit_sdpa"  # Transformers' sdpa, registered without a mask builder (see the module docstring)


def implementation(attn: str) -> str:
    """The attn_implementation the model is built with for the attention decision `attn`."""
    if attn != "sdpa" or not stack().packs_by_position_ids:
        return attn
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if CAUSAL_SDPA not in AttentionInterface._global_mapping:
        AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
    return CAUSAL_SDPA


def isolate_records(model: Any, attn: str) -> None:
    """Hook the decoder (the model's base, under any LoRA/FSDP wrapper added later): no cache, and where Transformers
    does not find records in position ids itself, a per-record mask for a batch that carries them."""
    kind = _record_mask_kind(attn)
    decoder = getattr(model, "base_model", model)
    decoder.register_forward_pre_hook(_decoder_hook(kind), with_kwargs=True)
    how = {
        "boolean": "a per-record boolean mask given to SDPA (a plain-text batch gets none: SDPA's is_causal)",
        "additive": "a per-record 4D attention mask (this transformers finds no records in position ids)",
        None: "position ids (Transformers' packed-sequence masks)",
    }[kind]
    if attn in FLASH_FAMILY:
        how = "one row per batch and its records' boundaries (cu_seq_lens) for flash-attention's varlen kernel"
    log.info("model: use_cache off for training; packed records are kept apart by %s", how)


def _record_mask_kind(attn: str) -> str | None:
    """The mask the hook builds for a batch of records: boolean for CAUSAL_SDPA, additive on stacks that find no
    records in position ids, none where Transformers or the varlen kernel keeps records apart."""
    if attn in FLASH_FAMILY:
        return None
    if implementation(attn) == CAUSAL_SDPA:
        return "boolean"
    return None if stack().packs_by_position_ids else "additive"


def _decoder_hook(kind: str | None) -> Callable[..., Any]:
    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        kwargs["use_cache"] = False
        positions = kwargs.get("position_ids")
        if kind is not None and positions is not None and kwargs.get("attention_mask") is None:
            dtype = torch.bool if kind == "boolean" else module.get_input_embeddings().weight.dtype
            kwargs["attention_mask"] = record_mask(positions, dtype)
        return args, kwargs

    return hook


def record_mask(positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[batch, 1, L, L] mask of where a token may attend (same record, not later): True/False for torch.bool;
    otherwise additive, 0 where allowed and the dtype's min elsewhere. A record starts wherever the position does not
    follow the previous one."""
    positions = positions.reshape(-1, positions.shape[-1])
    record = (torch.diff(positions, dim=-1, prepend=positions[:, :1] - 1) != 1).cumsum(-1)
    length = positions.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=positions.device).tril()
    allowed = (record[:, :, None] == record[:, None, :]) & causal
    if dtype == torch.bool:
        return allowed[:, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def collator_for(attn: str, count_trained: bool = False) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """The training DataLoader's collator: Transformers' default one; for flash-attention, packed records in one row
    with the varlen kernel's metadata (on transformers 5; 4.x's flash-attention 2 reads them from position ids).
    `count_trained`: each batch also carries how many positions it trains, counted on the host, for the chunked
    loss (trainer.model.chunked_loss), which then selects them without a host-device sync."""
    from transformers import default_data_collator

    collate = default_data_collator
    if attn in FLASH_FAMILY:
        collate = varlen_collator if stack().transformers_5 else one_row_collator
    return functools.partial(_with_trained_count, collate) if count_trained else collate


def _with_trained_count(collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
                        features: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    from trainer.model.chunked_loss import TRAINED_KEY, trained_count

    batch = collate(features)
    if "labels" in batch:
        batch[TRAINED_KEY] = trained_count(batch["labels"])
    return batch


def one_row_collator(features: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch of packed sequences as one row [1, batch x seq_len] (position ids say where each record starts)."""
    from transformers import default_data_collator

    batch = default_data_collator(features)
    if "position_ids" in batch:
        for key in ("input_ids", "labels", "position_ids"):
            batch[key] = batch[key].reshape(1, -1)
    return batch


def varlen_collator(features: list[dict[str, Any]]) -> dict[str, Any]:
    """One row, plus the records' boundaries as flash-attention's varlen kernel takes them (cu_seq_lens_q/k, int32,
    and integer max_length_q/k, as Transformers' DataCollatorWithFlattening gives them): computed here on the
    host, in the DataLoader, so the kernel needs no host sync in any layer and the compiled layer no graph break.
    Transformers' flash path reads records from position ids only for a one-row batch without these."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    batch = one_row_collator(features)
    if "position_ids" in batch:
        (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(batch["position_ids"])
        batch.update(cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k, max_length_q=int(max_q), max_length_k=int(max_k))
    return batch
