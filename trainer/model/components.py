"""What a model is made of, by component: parameters, trainable parameters and parameters active per token, from
the parameters' names: one classifier of parameter names and one table writer, logged before step 0 and kept in the
run's record (run_config.json's `components`).

COMPONENTS is a table of name patterns, tried in order, the first that matches wins: a vision-language model's
projector and vision tower (trainer.model.vision_parts' patterns), then the language model's parts. The table shows
the language model as one row ("language model"), except for a mixture of experts, where it shows the parts the
experts change: shared experts, routed experts, router, attention, embeddings/head, MLP, norms. A family with parts
of its own adds rows in front of those whose names its names also contain. LoRA's own parameters count with the
component they adapt: a name is read without PEFT's wrapping (`base_model.model.`, `.base_layer`,
`.lora_A.<adapter>`), so an adapter on the routed experts is the routed experts' trainable parameters.

Active per token: every parameter, except that a token passes through top-k of a layer's E routed experts
(trainer.config.moe), so the routed experts (and their adapters) count k/E of theirs; embeddings count whole, as the
published "active parameters" of MoE models do.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from trainer.config.moe import Moe, moe_of
from trainer.config.run_record import ComponentCount
from trainer.model.vision_parts import PROJECTOR, VISION_TOWER

if TYPE_CHECKING:
    import torch

log = logging.getLogger("trainer")

ROUTED = "routed experts"
SHARED = "shared experts"
ROUTER = "router"
ATTENTION = "attention"
EMBEDDINGS = "embeddings/head"
MLP = "MLP"
OTHER = "norms/other"
LANGUAGE = "language model"  # a model's language parts as one row (every model but a mixture of experts)

# Tried in order. A router is the gate's or router's own parameter (`mlp.gate.weight`, gpt-oss's `mlp.router.bias`,
# 4.x Mixtral's `block_sparse_moe.gate.weight`), never a dense MLP's gate_proj.
COMPONENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("projector", PROJECTOR),
    ("vision tower", VISION_TOWER),
    (SHARED, re.compile(r"\.shared_experts?(_gate)?\.")),
    (ROUTED, re.compile(r"\.experts\.")),
    (ROUTER, re.compile(r"\.(gate|router)\.[^.]+$")),
    (ATTENTION, re.compile(r"\.(self_attn|attention|attn)\.")),
    (EMBEDDINGS, re.compile(r"(^|\.)(embed_tokens|lm_head|embed_in|embed_out|wte|wpe|word_embeddings|score)\.")),
    (MLP, re.compile(r"\.(mlp|feed_forward|ffn|block_sparse_moe)\.")),
    (OTHER, re.compile(r"")),
)
LANGUAGE_PARTS = (SHARED, ROUTED, ROUTER, ATTENTION, EMBEDDINGS, MLP, OTHER)

_WRAPPING = re.compile(r"(^base_model\.model\.)|(\.base_layer)|(\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)"
                       r"\.[^.]+)|(\.modules_to_save\.[^.]+)|(\.original_module)")  # fmt: skip


def plain_name(name: str) -> str:
    """A parameter's name as the model without PEFT names it (`...experts.base_layer.lora_A.default.weight` ->
    `...experts.weight`): an adapter's parameters are classified with what they adapt."""
    return _WRAPPING.sub("", name)


def component_of(name: str) -> str:
    """The finest component a parameter (or a module's `.weight`) belongs to."""
    plain = plain_name(name)
    return next(component for component, pattern in COMPONENTS if pattern.search(plain))


def param_numel(p: torch.nn.Parameter) -> int:
    """Elements of a parameter: its full size under ZeRO-3 (`ds_numel`; the local shard is empty), and 4-bit
    weights packed two per byte counted as the weights they hold."""
    n = int(getattr(p, "ds_numel", 0) or p.numel())
    return n * 2 if p.__class__.__name__ == "Params4bit" else n


def routing(model: Any) -> Moe | None:
    """The model's routing, under any PEFT wrapper (trainer.config.moe); None for a dense model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return moe_of(getattr(base, "config", None) or {})


def count(model: torch.nn.Module) -> list[ComponentCount]:
    """The model's rows in COMPONENTS' order (components it lacks left out; tied tensors once; a dense language
    model's parts as one row) and a last row "total"."""
    moe = routing(model)
    totals: dict[str, list[int]] = {}
    for name, p in model.named_parameters():
        component = component_of(name)
        if moe is None and component in LANGUAGE_PARTS:
            component = LANGUAGE
        part = totals.setdefault(component, [0, 0])
        n = param_numel(p)
        part[0] += n
        part[1] += n if p.requires_grad else 0
    order = [*(c for c, _ in COMPONENTS[:2]), *((LANGUAGE,) if moe is None else LANGUAGE_PARTS)]
    share = moe.active_share if moe else 1.0
    found = [ComponentCount(c, totals[c][0], totals[c][1], round(totals[c][0] * (share if c == ROUTED else 1.0)))
             for c in order if totals.get(c, [0])[0]]  # fmt: skip
    sums = (sum(getattr(r, f) for r in found) for f in ("parameters", "trainable", "active"))
    return [*found, ComponentCount("total", *sums)]


def table_lines(rows: list[ComponentCount]) -> list[str]:
    """The table as aligned text lines (a header, one line per row, the trainable share)."""
    cells = [("component", "parameters", "trainable", "active/token"),
             *[(r.component, f"{r.parameters:,}", f"{r.trainable:,} ({100 * r.trainable / max(r.parameters, 1):.1f}%)",
                f"{r.active:,}") for r in rows]]  # fmt: skip
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    return ["  ".join(c[0].ljust(widths[0]) if i == 0 else c[i].rjust(widths[i]) for i in range(4)).rstrip()
            for c in cells]  # fmt: skip


def log_components(model: torch.nn.Module) -> list[ComponentCount]:
    """Log the table (before step 0) and return it, as the run's record keeps it."""
    rows = count(model)
    moe = routing(model)
    how = f" ({moe.describe()}: a token passes through {moe.top_k} of them)" if moe else ""
    log.info("components:%s\n  %s", how, "\n  ".join(table_lines(rows)))
    return rows
