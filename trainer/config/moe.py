"""The mixture-of-experts group's home (TRAIN_MOE_IMPL, TRAIN_MOE_AUX_LOSS): how a mixture's routed experts run and
the coefficient of its load-balancing loss, decided per run, and the TRL config's share of it. Also what these rules
read, torch-free: a model's routing (`Moe`) from its config or config.json, or a preset's (trainer.config.presets);
trainer/model/moe.py (routers, the implementation in force) and trainer/memory/ read it from here.

The implementation is measured, not guessed: on this project's 2-core CPU (torch 2.13, one thread, the tiny models
of tests/trainer/moe_models.py, LoRA, 2 x 256 tokens) grouped_mm took 0.021-0.033 CPU-seconds a step, eager
0.028-0.035, batched_mm 0.070-0.107 (it copies each token's expert weights); the losses agreed to 1e-6. On GPUs
grouped_mm is Transformers' own default, torch's grouped GEMM kernel from compute capability 8.0 (not measured here:
no GPU); below it Transformers falls back to a loop over the experts, which eager is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import compat
from trainer.config.decision import Decision, Decisions, SoFar
from trainer.config.presets import is_preset, language_preset

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware

EXPERTS_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")  # the routed experts per MoE layer
TOP_K_FIELDS = ("num_experts_per_tok", "moe_topk", "top_k")
GROUPED_MM_CAPABILITY = (8, 0)  # torch's grouped GEMM kernel on CUDA (Transformers' _can_use_grouped_mm)
NOT_MOE = "the model has no routed experts"


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


def moe_of_model(model: str) -> Moe | None:
    """A preset's routing, or a model folder's (its config.json); None for a dense or unreadable one."""
    if is_preset(model):
        p = language_preset(model)  # a vision preset's language model is dense
        return Moe(p.model_type, p.experts, p.top_k, p.aux_coef) if p.experts else None
    try:
        return moe_of(json.loads((Path(model) / "config.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def aux_coefficient(setting: str) -> float | None:
    """TRAIN_MOE_AUX_LOSS as a coefficient (off: 0.0); None for auto; ValueError for anything else."""
    if setting == "auto":
        return None
    if setting == "off":
        return 0.0
    value = float(setting)
    if not value >= 0 or value == float("inf"):
        raise ValueError(setting)
    return value


# ---- the group's functions (trainer/config/checks.py, decisions.py, training_arguments.py call them) ----------------


def problems(inputs: Inputs) -> list[str]:
    s = inputs.settings
    found = []
    try:
        coefficient = aux_coefficient(s.moe_aux_loss)
    except ValueError:
        found.append(f"TRAIN_MOE_AUX_LOSS={s.moe_aux_loss}: auto, off or a number >= 0 (a coefficient)")
        coefficient = None
    moe = moe_of_model(inputs.model_folder)
    if moe is None:
        asked = [f"TRAIN_MOE_IMPL={s.moe_impl}"] if s.moe_impl != "auto" else []
        asked += [f"TRAIN_MOE_AUX_LOSS={s.moe_aux_loss}"] if coefficient else []
        if asked:
            found.append(f"{' and '.join(asked)}: TRAIN_MODEL={s.model} is not a mixture of experts ({NOT_MOE}); "
                         "leave it at auto")  # fmt: skip
        return found
    if s.moe_impl != "auto" and not compat.stack().transformers_5:
        found.append(f"TRAIN_MOE_IMPL={s.moe_impl}: {compat.stack().describe()} keeps one module per expert (the "
                     "experts implementations are transformers 5's); leave it at auto")  # fmt: skip
    if coefficient and not moe.aux_coef:
        found.append(f"TRAIN_MOE_AUX_LOSS={s.moe_aux_loss}: {moe.model_type}'s forward computes no load-balancing "
                     "loss (the family defines none: DeepSeek-V3 balances by a routing bias); leave it at auto")
    return found


def decide_impl(s: TrainSettings, hw: Hardware, moe: Moe | None) -> Decision[str | None]:
    if moe is None:
        return Decision(None, NOT_MOE)
    if not compat.stack().transformers_5:
        return Decision(None, f"{compat.stack().describe()} keeps one module per expert (no experts implementations)")
    if s.moe_impl != "auto":
        return Decision(s.moe_impl, f"set by TRAIN_MOE_IMPL ({moe.describe()})")
    problem = grouped_mm_problem(hw.is_gpu, hw.capability)
    if problem:
        return Decision("eager", f"auto: {problem} (Transformers would loop over the experts, as eager does)")
    if hw.is_gpu:
        return Decision("grouped_mm", "auto: one grouped GEMM per projection for all experts (torch's kernel from "
                                      "compute capability 8.0; Transformers' own default)")  # fmt: skip
    return Decision("grouped_mm", "auto: torch's grouped GEMM on the CPU, measured fastest there (grouped_mm "
                                  "0.021-0.033, eager 0.028-0.035, batched_mm 0.070-0.107 CPU-s a step on 2 cores: "
                                  "trainer/config/moe.py)")  # fmt: skip


def grouped_mm_problem(gpu: bool, capability: tuple[int, int] | None) -> str:
    """Why torch's grouped GEMM kernel cannot run on this device ('' where it can): the decision and bench ask."""
    if gpu and (capability is None or tuple(capability) < GROUPED_MM_CAPABILITY):
        major, minor = capability or (0, 0)
        return f"torch's grouped GEMM kernel needs compute capability 8.0 (this GPU: {major}.{minor})"
    if not gpu and not compat.stack().grouped_mm_on_cpu:
        return f"{compat.stack().describe()} has no grouped GEMM kernel on the CPU (from torch 2.9)"
    return ""


def decide_aux_loss(s: TrainSettings, moe: Moe | None) -> Decision[float | None]:
    if moe is None:
        return Decision(None, NOT_MOE)
    coefficient = aux_coefficient(s.moe_aux_loss)
    if coefficient is not None:
        return Decision(coefficient, f"set by TRAIN_MOE_AUX_LOSS ({moe.model_type}'s own: {moe.aux_coef:g})")
    if not moe.aux_coef:
        return Decision(0.0, f"auto: {moe.model_type} defines no load-balancing loss")
    return Decision(moe.aux_coef, f"auto: {moe.model_type}'s router_aux_loss_coef")


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    s = inputs.settings
    moe = moe_of_model(inputs.model_folder)
    refused = Decision(None, "refused")
    return {
        "moe_impl": so_far.attempt(decide_impl, s, hardware, moe, fallback=refused),
        "moe_aux_loss": so_far.attempt(decide_aux_loss, s, moe, fallback=refused),
    }


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    """TRL's preference and online trainers add the load-balancing loss themselves, with their config's coefficient
    (the model adds it only where it computes the loss from labels: SFT)."""
    from trainer.config.method import trl_fields

    coefficient = decisions.moe_aux_loss.value
    if coefficient is None or "router_aux_loss_coef" not in trl_fields(settings):
        return {}
    return {"router_aux_loss_coef": coefficient}

