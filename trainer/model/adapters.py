"""LoRA: a new adapter to train (apply_lora), a saved one attached to its base (attach_adapter: the one
PeftModel.from_pretrained), and an adapter folded into the base's weights (merged)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config.sharding import fsdp_checkpoints_activations

if TYPE_CHECKING:
    from trainer.config.schema import TrainSettings

log = logging.getLogger("trainer")


def apply_lora(model: Any, s: TrainSettings) -> Any:
    """A new LoRA adapter on `model` as TRAIN_LORA_* say (QLoRA: the quantized base prepared for training first)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if s.quant != "none":
        checkpointing = s.grad_ckpt and not fsdp_checkpoints_activations(s)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
    elif s.grad_ckpt:
        # Frozen embeddings produce no grad; checkpointed blocks need an input that requires one.
        model.enable_input_require_grads()
    from trainer.config.moe import moe_of
    from trainer.model import lora_targets
    from trainer.model.moe import routers

    moe = moe_of(model.config)
    targets = lora_targets.resolve(s.lora_targets, model, moe)
    # PEFT's parameter adapters (fused experts, routers) refuse dropout: they get none, the module adapters TRAIN's
    dropout = 0.0 if targets.parameters else s.lora_dropout
    lora = LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=dropout, task_type="CAUSAL_LM",
                      **lora_targets.lora_kwargs(targets))  # fmt: skip
    lora_targets.check(targets, lora_targets.planned(targets, model), moe, len(routers(model)))
    with names_kept():  # its adapters are fp32 on a bf16/fp16 base (autocast_adapter_dtype)
        peft_model = get_peft_model(model, lora)
    done = lora_targets.adapted(peft_model)
    if targets.parameters:
        lora_targets.drop_out_module_inputs(peft_model, s.lora_dropout)
    log.info("LoRA: r=%d alpha=%d dropout=%g targets=%s: adapts %s%s", s.lora_r, s.lora_alpha, s.lora_dropout,
             s.lora_targets, lora_targets.describe(done, moe),
             " (the parameter adapters take no dropout: PEFT cannot drop their input out)" if targets.parameters and
             s.lora_dropout else "")  # fmt: skip
    return peft_model


@contextlib.contextmanager
def names_kept() -> Iterator[None]:
    """PEFT as asked, without its renaming of transformers 4 names: for the families whose experts Transformers 5
    fuses (Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3, ...), PEFT rewrites any target ending in gate_proj, up_proj,
    down_proj, gate or w1-w3 into the fused routed experts (and the router), so that adapters made on transformers 4
    still load. Here the targets are this model's own names (trainer.model.lora_targets): a shared expert's or a
    dense layer's gate_proj is that module, and an adapter asked for the shared experts would otherwise land on the
    routed ones."""
    from unittest import mock

    from peft.utils import transformers_weight_conversion

    with mock.patch.object(transformers_weight_conversion, "convert_peft_config_for_transformers", _keep):
        yield


def _keep(*_args: Any, **_kwargs: Any) -> None:
    return None


def attach_adapter(base: Any, adapter: Path) -> Any:
    """base + a saved adapter through PEFT, unmerged (trainer.model.loading fits the base's embeddings to the
    tokenizer first, as the run did before adding its adapter). An adapter that names this model's own targets
    (parameters, or modules by their full names: trainkit's) is attached as named; one of bare transformers 4 names
    goes through PEFT's renaming."""
    from peft import PeftModel

    with names_kept() if _own_names(adapter) else contextlib.nullcontext():
        return PeftModel.from_pretrained(base, str(adapter))


def _own_names(adapter: Path) -> bool:
    import json

    try:
        config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return False
    modules = config.get("target_modules") or []
    return bool(config.get("target_parameters")) or (isinstance(modules, list) and any("." in m for m in modules))


def merged(peft_model: Any) -> Any:
    """A copy of the PEFT model with the adapter folded into the weights (the original stays unmerged)."""
    import copy

    return merge_into_base(copy.deepcopy(peft_model))


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
