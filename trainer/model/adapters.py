"""LoRA: a new adapter to train (apply_lora: TRAIN_LORA_TARGETS read against the model by trainer.model.lora_targets,
a mixture's fused experts through PEFT's target_parameters), a saved one attached to its base (attach_adapter: the
one PeftModel.from_pretrained, after `fit_problem` found each of the adapter's tensors a module of the base with its
shape: PEFT itself only warns of adapter keys the base lacks, and then runs the base without them), and an adapter
folded into the base's weights (merged; fused experts checked: trainer.model.expert_adapters)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config.sharding import fsdp_checkpoints_activations
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.config.schema import TrainSettings

log = logging.getLogger("trainer")


def apply_lora(model: Any, s: TrainSettings, targets: list[str] | None = None, whole: list[str] | None = None) -> Any:
    """A new LoRA adapter on `model` as TRAIN_LORA_* say (QLoRA: the quantized base prepared for training first);
    `targets` replaces TRAIN_LORA_TARGETS' all-linear (a vision-language model's: its language model's linears),
    `whole` names modules trained whole beside the adapter (PEFT's modules_to_save: a projector)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if s.quant != "none":
        checkpointing = s.grad_ckpt and not fsdp_checkpoints_activations(s)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
    elif s.grad_ckpt:
        # Frozen embeddings produce no grad; checkpointed blocks need an input that requires one.
        model.enable_input_require_grads()
    from trainer.config.moe import moe_of
    from trainer.model import lora_targets
    from trainer.model.expert_adapters import names_kept
    from trainer.model.moe import routers

    moe = moe_of(model.config)
    chosen = lora_targets.resolve(s.lora_targets, model, moe)
    if s.lora_targets == "all-linear" and targets is not None:  # a vision-language model's trained parts
        chosen = lora_targets.Targets(words=["all-linear"], modules=list(targets))
    else:
        lora_targets.check(chosen, lora_targets.planned(chosen, model), moe, len(routers(model)))
    # PEFT's parameter adapters (fused experts, routers) refuse dropout: they get none, the module adapters TRAIN's
    lora = LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=0.0 if chosen.parameters else s.lora_dropout,
                      task_type="CAUSAL_LM", modules_to_save=whole or None,
                      **lora_targets.lora_kwargs(chosen))  # fmt: skip
    with names_kept():  # its adapters are fp32 on a bf16/fp16 base (autocast_adapter_dtype)
        peft_model = get_peft_model(model, lora)
    if chosen.parameters:
        lora_targets.drop_out_module_inputs(peft_model, s.lora_dropout)
    said = s.lora_targets
    if targets is not None and s.lora_targets == "all-linear":
        said = f"the {len(targets)} linears of the trained parts"
    log.info("LoRA: r=%d alpha=%d dropout=%g targets=%s: adapts %s%s%s", s.lora_r, s.lora_alpha, s.lora_dropout,
             said, lora_targets.describe(lora_targets.adapted(peft_model), moe),
             f"; trained whole: {', '.join(whole)}" if whole else "",
             " (the parameter adapters take no dropout: PEFT cannot drop their input out)" if chosen.parameters and
             s.lora_dropout else "")  # fmt: skip
    if whole:
        train_whole_in_fp32(peft_model)
    return peft_model


def train_whole_in_fp32(model: Any) -> None:
    """PEFT's copies of the modules trained whole (modules_to_save) keep the base's dtype: a bf16 copy, stepped in
    bf16 by the optimizer, loses every update under bf16's resolution (a weight of 0.02 moves by 8e-5 or not at
    all). They train in fp32, as the adapters do (autocast computes with them in the compute dtype)."""
    import torch

    for param in model.parameters():
        if param.requires_grad and param.is_floating_point() and param.dtype != torch.float32:
            param.data = param.data.float()


def attach_adapter(base: Any, adapter: Path) -> Any:
    """base + a saved adapter through PEFT, unmerged (trainer.model.loading fits the base's embeddings to the
    tokenizer first, as the run did before adding its adapter); ConfigError (exit 2) naming both when the adapter
    does not fit the base (`fit_problem`)."""
    from peft import PeftModel

    from trainer.model.expert_adapters import names_kept, own_names

    problem = fit_problem(base, adapter)
    if problem:
        raise ConfigError(problem)
    with names_kept() if own_names(adapter) else contextlib.nullcontext():
        return PeftModel.from_pretrained(base, str(adapter))


PEFT_PREFIX = "base_model.model."  # a saved adapter's keys: this, the base's module path, then PEFT's own part
LORA_IN = ("lora_A", "lora_embedding_A")  # (r, inputs)
LORA_OUT = ("lora_B", "lora_embedding_B")  # (outputs, r)
PEFT_PARTS = (*LORA_IN, *LORA_OUT, "lora_magnitude_vector", "token_adapter", "modules_to_save")


def fit_problem(base: Any, adapter: Path) -> str | None:
    """Why the adapter in `adapter` does not fit `base` (a loaded model): a tensor of it names a module the base lacks,
    or one whose inputs or outputs differ; None when every tensor fits."""
    modules = dict(base.named_modules())
    params = {name: tuple(p.shape) for name, p in base.named_parameters()}
    tensors = _adapter_shapes(adapter)
    missing, misfit = [], []
    for key, shape in tensors.items():
        parts = key.removeprefix(PEFT_PREFIX).split(".")
        at = next((i for i, part in enumerate(parts) if part in PEFT_PARTS), None)
        if at is None:  # a whole tensor of the base's (modules_to_save): the base's own, of the same shape
            name = ".".join(parts)
            if name not in params:
                missing.append(name)
            elif params[name] != shape:
                misfit.append(f"{name} is {list(shape)} in the adapter, {list(params[name])} in the base")
            continue
        path = ".".join(p for p in parts[:at] if p != "base_layer")  # a parameter's adapters nest (PEFT's ParamWrapper)
        if path not in modules:
            missing.append(path)
            continue
        wrong = _dims_problem(path, modules[path], parts[at], shape)
        if wrong:
            misfit.append(wrong)
    if not (missing or misfit):
        return None
    base_name = f"{getattr(base, 'name_or_path', '') or '?'} ({type(base).__name__})"
    what = "; ".join([*([f"{len(missing)} of its {len(tensors)} tensors are for modules the base lacks (first: "
                         f"{missing[0]})"] if missing else []),
                      *([f"{len(misfit)} of its {len(tensors)} tensors do not match the base's shapes (first: "
                         f"{misfit[0]})"] if misfit else [])])  # fmt: skip
    trained_on = _trained_on(adapter)
    return (f"the LoRA adapter {adapter} does not fit the base {base_name}: {what}; give the base it was trained on"
            + (f" ({trained_on}, as its adapter_config.json says)" if trained_on else ""))  # fmt: skip


def _dims_problem(path: str, module: Any, part: str, shape: tuple[int, ...]) -> str | None:
    dims = _dims(module)
    if dims is None or part not in (*LORA_IN, *LORA_OUT):
        return None
    inputs, outputs = dims
    if part in LORA_IN and shape[-1] != inputs:
        return f"{path} takes {shape[-1]} inputs in the adapter, {inputs} in the base"
    if part in LORA_OUT and shape[0] != outputs:
        return f"{path} gives {shape[0]} outputs in the adapter, {outputs} in the base"
    return None


def _dims(module: Any) -> tuple[int, int] | None:
    """(inputs, outputs) of a layer LoRA adapts: Linear (bitsandbytes' too), Embedding, GPT-2's Conv1D."""
    if hasattr(module, "in_features") and hasattr(module, "out_features"):
        return int(module.in_features), int(module.out_features)
    if hasattr(module, "num_embeddings"):
        return int(module.num_embeddings), int(module.embedding_dim)
    if hasattr(module, "nf") and getattr(module, "weight", None) is not None:
        return int(module.weight.shape[0]), int(module.nf)
    return None


def _adapter_shapes(adapter: Path) -> dict[str, tuple[int, ...]]:
    """Each saved tensor's name and shape (safetensors: its header only)."""
    file = adapter / "adapter_model.safetensors"
    if file.is_file():
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as weights:
            return {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118
    if not (adapter / "adapter_model.bin").is_file():
        return {}  # no weights: PEFT's own error names what is missing
    import torch

    state = torch.load(adapter / "adapter_model.bin", map_location="cpu", weights_only=True, mmap=True)
    return {key: tuple(value.shape) for key, value in state.items()}


def _trained_on(adapter: Path) -> str | None:
    import json

    try:
        return json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None


def merged(peft_model: Any) -> Any:
    """A copy of the PEFT model with the adapter folded into the weights (the original stays unmerged; fused experts
    checked against base + adapter: trainer.model.expert_adapters)."""
    import copy

    from trainer.model.expert_adapters import merge_into_base

    return merge_into_base(copy.deepcopy(peft_model))
