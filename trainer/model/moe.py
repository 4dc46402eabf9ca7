"""Mixture-of-experts models: what a model's routed experts are (Moe, read from its config or config.json), where
its routers are, and which experts implementation Transformers runs them with.

Transformers 5 stores a layer's routed experts as fused 3D parameters (`experts.gate_up_proj` [E, ...],
`experts.down_proj`) and runs them with an implementation chosen at load (`experts_implementation`): `eager` (a
loop over the experts that received tokens), `batched_mm` (each token's expert weights gathered, one bmm) or
`grouped_mm` (tokens sorted by expert, one grouped GEMM per projection: torch's kernel on CUDA from compute
capability 8.0 and on CPUs from torch 2.9, else Transformers' own loop). Which one a run uses is a decision
(trainer.config, per device); the loader applies it (LoadHow.experts).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.model.components import ROUTER, component_of

if TYPE_CHECKING:
    import torch

log = logging.getLogger("trainer")

EXPERTS_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")  # the routed experts per MoE layer
TOP_K_FIELDS = ("num_experts_per_tok", "moe_topk", "top_k")
EXPERT_IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")  # Transformers 5's own (its kernels-hub ones left out)


@dataclass(frozen=True)
class Moe:
    """A mixture-of-experts model's routing, from its config."""

    model_type: str
    experts: int  # routed experts per MoE layer
    top_k: int  # routed experts per token
    aux_coef: float  # the load-balancing loss's coefficient its forward adds (router_aux_loss_coef); 0: none

    @property
    def active_share(self) -> float:
        """The share of a layer's routed experts a token passes through."""
        return self.top_k / self.experts

    def describe(self) -> str:
        return f"{self.model_type}: top-{self.top_k} of {self.experts} routed experts"


def _field(config: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value:
            return value
    return None


def _text_config(config: Any) -> Any:
    """A multimodal model's language part (its routed experts live there), else the config itself."""
    if isinstance(config, Mapping):
        return config.get("text_config") or config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def moe_of(config: Any) -> Moe | None:
    """The routing of a model config (a Transformers config or config.json's mapping); None for a dense model."""
    text = _text_config(config)
    experts, top_k = _field(text, EXPERTS_FIELDS), _field(text, TOP_K_FIELDS)
    if not experts or not top_k or int(experts) <= 1:
        return None
    model_type = text.get("model_type", "") if isinstance(text, Mapping) else getattr(text, "model_type", "")
    return Moe(str(model_type), int(experts), int(top_k), float(_field(text, ("router_aux_loss_coef",)) or 0.0))


def routers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of each router, in layer order: the modules whose own parameters are the router's
    (trainer.model.components), under any PEFT wrapper (a router with a LoRA adapter: its wrapper)."""
    found: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        own = [n for n, _ in module.named_parameters(recurse=False)]
        if ".lora_" in name or not own or _inside(name, found):
            continue
        if all(component_of(f"{name}.{n}") == ROUTER for n in own):
            found[name] = module
    return list(found.items())


def _inside(name: str, found: dict[str, Any]) -> bool:
    return any(name.startswith(outer + ".") for outer in found)


def experts_implementation(model: Any) -> str | None:
    """The experts implementation the model runs with; None where Transformers has no such switch (4.x: one module
    per expert)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base.config, "_experts_implementation", None)
