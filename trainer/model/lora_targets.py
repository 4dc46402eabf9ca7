"""TRAIN_LORA_TARGETS read against the model: what PEFT is given, and what it adapted, counted by component.

Words: `all-linear` (PEFT's: every linear module but the head; on a mixture of experts also its routed experts),
the components `attention`, `experts` (the routed experts), `shared_experts` and `router`
(trainer.model.components), and any module name as PEFT takes it (`q_proj`: every module named so, or ending so).
Transformers 5 keeps a layer's routed experts as fused 3D parameters, not modules: module names cannot reach them,
so `experts` is given to PEFT as `target_parameters` (its ParamWrapper: one LoRA pair per expert, A [E*r, in],
B [out, E*r]); a router is a parameter too.

Nothing is adapted silently less than asked: a word that adapts nothing, or MLP projection names (gate_proj,
up_proj, down_proj, ...) on a mixture of experts whose routed experts they leave out (only the shared experts or a
dense layer matched: the miss reported against other tools), is a ConfigError (exit 2) naming what each word
adapted.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainer.config.moe import Moe
from trainer.errors import ConfigError
from trainer.model.components import ATTENTION, MLP, ROUTED, ROUTER, SHARED, component_of, plain_name

if TYPE_CHECKING:
    import torch

log = logging.getLogger("trainer")

ALL_LINEAR = "all-linear"
WORDS = {"attention": ATTENTION, "experts": ROUTED, "shared_experts": SHARED, "router": ROUTER}
# Names that mean an MLP's projections: asked of a mixture of experts, they ask for its experts.
MLP_NAMES = frozenset({"gate_proj", "up_proj", "down_proj", "gate_up_proj", "w1", "w2", "w3", "fc1", "fc2", "c_fc",
                       "mlp", "dense_h_to_4h", "dense_4h_to_h"})  # fmt: skip


@dataclass
class Targets:
    """PEFT's target_modules and target_parameters for the words asked."""

    words: list[str]
    modules: list[str] | str = field(default_factory=list)
    parameters: list[str] = field(default_factory=list)


def words_of(setting: str) -> list[str]:
    return [w.strip() for w in setting.split(",") if w.strip()]


def _linear_names(model: torch.nn.Module, component: str) -> list[str]:
    import torch

    return [name for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and component_of(f"{name}.weight") == component]  # fmt: skip


def _parameter_suffixes(model: torch.nn.Module, component: str, ndim: int) -> list[str]:
    """`module.parameter` suffixes (`experts.gate_up_proj`, `gate.weight`) of the component's parameters of `ndim`
    dimensions that belong to no linear module (fused experts, a router's own weight)."""
    import torch

    owners = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    found = []
    for name, p in model.named_parameters():
        module = name.rpartition(".")[0]
        if p.dim() == ndim and module not in owners and component_of(name) == component:
            found.append(".".join(name.split(".")[-2:]))
    return sorted(set(found))


def resolve(setting: str, model: torch.nn.Module, moe: Moe | None) -> Targets:
    """What PEFT is given for TRAIN_LORA_TARGETS on `model`."""
    targets = Targets(words_of(setting))
    modules: list[str] = []
    for word in targets.words:
        if word == ALL_LINEAR:
            targets.modules = ALL_LINEAR
            if moe is not None:
                targets.parameters += _parameter_suffixes(model, ROUTED, 3)
        elif word in WORDS:
            component = WORDS[word]
            modules += _linear_names(model, component)
            targets.parameters += _parameter_suffixes(model, component, 3 if component == ROUTED else 2)
        else:
            modules.append(word)
    if targets.modules != ALL_LINEAR:
        targets.modules = list(dict.fromkeys(modules))
    targets.parameters = list(dict.fromkeys(targets.parameters))
    return targets


def planned(targets: Targets, model: torch.nn.Module) -> list[tuple[str, str]]:
    """(component, name) of what PEFT will adapt, matched as PEFT matches (a name, or its `.`-suffix): a module's
    `.weight`, or a parameter."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    found = []
    for name, module in model.named_modules():
        if "weight" not in dict(module.named_parameters(recurse=False)):
            continue
        if targets.modules == ALL_LINEAR:
            hit = _is_linear(module) and module is not head
        else:
            hit = any(name == t or name.endswith(f".{t}") for t in targets.modules)
        if hit:
            found.append((component_of(f"{name}.weight"), f"{name}.weight"))
    for name, _ in model.named_parameters():
        if any(name == t or name.endswith(f".{t}") for t in targets.parameters):
            found.append((component_of(name), name))
    return found


def _is_linear(module: torch.nn.Module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


def adapted(peft_model: torch.nn.Module) -> list[tuple[str, str]]:
    """(component, target's name) of every LoRA layer PEFT made: a module's `.weight`, or a parameter."""
    found = []
    for name, module in peft_model.named_modules():
        if not hasattr(module, "lora_A") or not len(module.lora_A):
            continue
        target = f"{name}.{module.parameter_name}" if hasattr(module, "parameter_name") else f"{name}.weight"
        found.append((component_of(target), plain_name(target)))
    return found


def word_counts(targets: Targets, done: list[tuple[str, str]]) -> dict[str, int]:
    """Adapted targets per word asked."""
    counts = {}
    for word in targets.words:
        if word == ALL_LINEAR:
            counts[word] = len(done)
        elif word in WORDS:
            counts[word] = sum(1 for component, _ in done if component == WORDS[word])
        else:
            counts[word] = sum(1 for _, name in done if f".{name.rpartition('.')[0]}".endswith(f".{word}"))
    return counts


def check(targets: Targets, done: list[tuple[str, str]], moe: Moe | None, moe_layers: int) -> None:
    """A ConfigError where a word adapts nothing, or MLP names leave a mixture's routed experts out."""
    counts = word_counts(targets, done)
    by_component = Counter(component for component, _ in done)
    said = ", ".join(f"{w}: {n}" for w, n in counts.items())
    where = f"TRAIN_LORA_TARGETS={','.join(targets.words)}"
    empty = [w for w, n in counts.items() if n == 0]
    if empty:
        verb = "matches" if len(empty) == 1 else "match"
        raise ConfigError(f"{where}: {', '.join(empty)} {verb} nothing on this model (targets per word: {said}); "
                          f"{_names_hint(moe)}")  # fmt: skip
    asked_mlp = any(w in MLP_NAMES for w in targets.words)
    if moe is not None and asked_mlp and not by_component[ROUTED]:
        layers = f"{moe_layers} MoE layer{'s' if moe_layers != 1 else ''}"
        raise ConfigError(
            f"{where} adapts {by_component[SHARED]} shared-expert and {by_component[MLP]} dense MLP modules but "
            f"none of the routed experts ({layers} x {moe.experts} experts: fused 3D parameters, which module names "
            "do not reach); add `experts` to adapt them, or name `shared_experts` to adapt only the shared ones "
            f"(targets per word: {said})"
        )


def _names_hint(moe: Moe | None) -> str:
    words = "all-linear, attention, experts, shared_experts, router" if moe else "all-linear, attention"
    return f"use {words} or module names of this model"


def describe(done: list[tuple[str, str]], moe: Moe | None) -> str:
    """One line: how many targets each component got (routed experts: fused parameters, each with E experts)."""
    counts = Counter(component for component, _ in done)
    parts = []
    for component, n in counts.items():
        if component == ROUTED and moe is not None:
            parts.append(f"{component} {n} fused parameters x {moe.experts} experts")
        else:
            parts.append(f"{component} {n}")
    return ", ".join(parts)


def lora_kwargs(targets: Targets) -> dict[str, Any]:
    """LoraConfig's target arguments."""
    kwargs: dict[str, Any] = {"target_modules": targets.modules}
    if targets.parameters:
        kwargs["target_parameters"] = targets.parameters
    return kwargs


def drop_out_module_inputs(peft_model: torch.nn.Module, p: float, adapter: str = "default") -> int:
    """TRAIN_LORA_DROPOUT on the module adapters; PEFT's parameter adapters (fused experts, routers) take none: their
    input cannot be dropped out apart from the base weight's (PEFT refuses dropout there). Returns the modules."""
    import torch

    changed = 0
    for module in peft_model.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if p > 0 and not hasattr(module, "parameter_name") and dropouts is not None and adapter in dropouts:
            dropouts[adapter] = torch.nn.Dropout(p=p)
            changed += 1
    return changed
