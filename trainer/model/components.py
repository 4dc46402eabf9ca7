"""What a model is made of, by component: parameters, trainable parameters and parameters active per token, from
the parameters' names.

One classifier (COMPONENTS: a table of name patterns, tried in order, the first that matches wins) and one table
writer. The run logs the table before step 0 and keeps it in its record (run_config.json's `components`). A
family with parts of its own adds rows in front of the generic ones (a vision tower and its projector before
`attention`, whose names they also contain). LoRA's own parameters count with the component they adapt: a name is
read without PEFT's wrapping (`base_model.model.`, `.base_layer`, `.lora_A.<adapter>`), so an adapter on the routed
experts is a routed-experts row's trainable parameters.

Active per token: every parameter, except that a token passes through top-k of a layer's E routed experts
(trainer.model.moe), so the routed experts (and their adapters) count k/E of theirs; embeddings count whole, as
the published "active parameters" of MoE models do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.config.run_record import ComponentCount

if TYPE_CHECKING:
    import torch

ROUTED = "routed experts"
SHARED = "shared experts"
ROUTER = "router"
ATTENTION = "attention"
EMBEDDINGS = "embeddings/head"
MLP = "MLP"
OTHER = "norms/other"


@dataclass(frozen=True)
class Component:
    name: str
    pattern: re.Pattern[str]  # searched in the parameter's name, PEFT's wrapping removed (`plain_name`)


def _row(name: str, pattern: str) -> Component:
    return Component(name, re.compile(pattern))


# Tried in order. A router is the gate's or router's own parameter (`mlp.gate.weight`, gpt-oss's `mlp.router.bias`,
# 4.x Mixtral's `block_sparse_moe.gate.weight`), never a dense MLP's gate_proj.
COMPONENTS: tuple[Component, ...] = (
    _row(SHARED, r"\.shared_experts?(_gate)?\."),
    _row(ROUTED, r"\.experts\."),
    _row(ROUTER, r"\.(gate|router)\.[^.]+$"),
    _row(ATTENTION, r"\.(self_attn|attention|attn)\."),
    _row(EMBEDDINGS, r"(^|\.)(embed_tokens|lm_head|embed_in|embed_out|wte|wpe|word_embeddings|score)\."),
    _row(MLP, r"\.(mlp|feed_forward|ffn|block_sparse_moe)\."),
    _row(OTHER, r""),
)

_WRAPPING = re.compile(r"(^base_model\.model\.)|(\.base_layer)|(\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)"
                       r"\.[^.]+)|(\.modules_to_save\.[^.]+)|(\.original_module)")  # fmt: skip


def plain_name(name: str) -> str:
    """A parameter's name as the model without PEFT names it (`...experts.base_layer.lora_A.default.weight` ->
    `...experts.weight`): an adapter's parameters are classified with what they adapt."""
    return _WRAPPING.sub("", name)


def component_of(name: str, table: Iterable[Component] = COMPONENTS) -> str:
    plain = plain_name(name)
    return next(c.name for c in table if c.pattern.search(plain))


def param_numel(p: torch.nn.Parameter) -> int:
    """Elements of a parameter: its full size under ZeRO-3 (`ds_numel`; the local shard is empty), and 4-bit
    weights packed two per byte counted as the weights they hold."""
    n = int(getattr(p, "ds_numel", 0) or p.numel())
    return n * 2 if p.__class__.__name__ == "Params4bit" else n


def count(model: torch.nn.Module, active_share: float = 1.0,
          table: Iterable[Component] = COMPONENTS) -> list[ComponentCount]:  # fmt: skip
    """The model's rows in the table's order (components it lacks left out) and a last row "total". `active_share`:
    the routed experts' share a token passes through (top-k / E; 1.0 for a dense model)."""
    rows = tuple(table)
    totals = {c.name: [0, 0] for c in rows}
    for name, p in model.named_parameters():
        n = param_numel(p)
        part = totals[component_of(name, rows)]
        part[0] += n
        part[1] += n if p.requires_grad else 0
    found = [ComponentCount(name, total, trainable, round(total * (active_share if name == ROUTED else 1.0)))
             for name, (total, trainable) in totals.items() if total]  # fmt: skip
    sums = (sum(getattr(r, f) for r in found) for f in ("parameters", "trainable", "active"))
    return [*found, ComponentCount("total", *sums)]


def table_lines(rows: list[ComponentCount]) -> list[str]:
    """The table as aligned text lines (a header, one line per row)."""
    header = ("component", "parameters", "trainable", "active/token")
    cells = [header, *[(r.component, f"{r.parameters:,}", f"{r.trainable:,}", f"{r.active:,}") for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    return ["  ".join(c[0].ljust(widths[0]) if i == 0 else c[i].rjust(widths[i]) for i in range(4)).rstrip()
            for c in cells]  # fmt: skip
