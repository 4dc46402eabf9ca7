"""A mixture of experts as built: where its routers are, and which experts implementation Transformers runs its routed
experts with (its routing, torch-free, is trainer.config.moe's `Moe`).

Transformers 5 stores a layer's routed experts as fused 3D parameters (`experts.gate_up_proj` [E, ...],
`experts.down_proj`) and runs them with the implementation chosen at load (`experts_implementation`, which the run
takes from its decision: trainer.config.moe): `eager` (a loop over the experts that received tokens), `batched_mm`
(each token's expert weights gathered, one bmm) or `grouped_mm` (tokens sorted by expert, one grouped GEMM per
projection).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.model.components import ROUTER, component_of

if TYPE_CHECKING:
    import torch


def routers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of each router, in layer order: the modules whose own parameters are the router's
    (trainer.model.components), under any PEFT wrapper (a router with a LoRA adapter: its wrapped module)."""
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

