"""LoRA on a mixture of experts' fused experts (PEFT's target_parameters), the parts trainer.model.adapters asks for:
PEFT without its renaming of transformers 4 names (`names_kept`, `own_names`), and the merge checked expert by expert
(`merge_into_base`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("trainer")


@contextlib.contextmanager
def names_kept() -> Iterator[None]:
    """PEFT as asked, without its renaming of transformers 4 names: for the families whose experts Transformers 5
    fuses (Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3, ...), PEFT rewrites any target ending in gate_proj, up_proj,
    down_proj, gate or w1-w3 into the fused routed experts (and the router), so that adapters made on transformers 4
    still load. Here the targets are this model's own names (trainer.model.lora_targets): a shared expert's or a
    dense layer's gate_proj is that module, and an adapter asked for the shared experts would otherwise land on the
    routed ones. A PEFT without that renaming (the oldest row's) takes the names as they are."""
    from unittest import mock

    try:
        from peft.utils import transformers_weight_conversion
    except ImportError:
        yield
        return
    with mock.patch.object(transformers_weight_conversion, "convert_peft_config_for_transformers", _keep):
        yield


def _keep(*_args: Any, **_kwargs: Any) -> None:
    return None


def own_names(adapter: Path) -> bool:
    """Whether a saved adapter names this model's own targets (parameters, or modules by their full names: trainkit's
    adapters), which PEFT must not rename; an adapter of bare transformers 4 names goes through PEFT's renaming."""
    import json

    try:
        config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return False
    modules = config.get("target_modules") or []
    return bool(config.get("target_parameters")) or (isinstance(modules, list) and any("." in m for m in modules))


class FusedMergeError(Exception):
    """A fused experts parameter, merged, is not its base plus its adapter: the merged model would not compute what
    was trained."""


def merge_into_base(peft_model: Any) -> Any:
    """The adapter folded into the weights, in place: the plain model. Each fused experts parameter is merged on its
    own first and checked: merged = base + scaling x (B_e A_e per expert), as the training forward computed it (PEFT's
    factors), within the parameter dtype's rounding (FusedMergeError otherwise)."""
    import torch

    checked, worst = 0, 0.0
    for module in peft_model.modules():
        if getattr(module, "num_experts", 1) <= 1 or not hasattr(module, "get_delta_factors"):
            continue
        for adapter in [a for a in module.active_adapters if a in module.lora_A]:  # as merge_and_unload: the
            # active ones (not TRL's frozen "ref" copy)
            param = module.get_param()
            lhs, rhs, scaling = module.get_delta_factors(adapter)
            expected = param.detach().float() + scaling * torch.bmm(lhs.detach().float(), rhs.detach().float())
            module.merge(adapter_names=[adapter])
            diff = float((module.get_param().detach().float() - expected).abs().max())
            allowed = 4 * torch.finfo(param.dtype).eps * float(expected.abs().max()) + 1e-12
            if not diff <= allowed:
                raise FusedMergeError(f"{module.parameter_name} of {type(module.get_base_layer()).__name__}: merged "
                                      f"weights differ from base + adapter by {diff:.3g} (rounding allows "
                                      f"{allowed:.3g})")  # fmt: skip
            checked, worst = checked + 1, max(worst, diff)
    if checked:
        log.info("LoRA merge: %d fused expert parameters folded in, each equal to base + adapter (largest "
                 "difference %.2g, within its dtype's rounding)", checked, worst)  # fmt: skip
    return peft_model.merge_and_unload()
