"""A vision-language model's three parts, by parameter name: the vision tower, the projector that maps its features
into the language model, and the language model (everything else: its embeddings, layers and head). What trains is
chosen by part (TRAIN_TRAINABLE); the freeze is applied, then checked: a part asked to stay frozen that holds a
trainable parameter (a LoRA target reaching into the tower, say) exits 2 naming it, never a silent partial freeze.

The patterns are searched in the parameter's name (PEFT's prefixes do not change a name's part: a LoRA weight inside
the vision tower is the tower's); the projector's come first (Qwen-VL's merger lives inside `visual`).
"""

from __future__ import annotations

import re
from typing import Any

from trainer.errors import ConfigError

PROJECTOR = re.compile(
    r"(^|\.)(multi_modal_projector|mm_projector|connector|visual\.merger|visual\.deepstack_merger_list)(\.|$)")
VISION_TOWER = re.compile(r"(^|\.)(visual|vision_tower|vision_model|vision_encoder)(\.|$)")
PARTS = {"vision": "vision tower", "projector": "projector", "language": "language model"}
SHOWN_NAMES = 3


def part_of(name: str) -> str:
    """The part ("vision", "projector" or "language") a parameter or module name belongs to."""
    if PROJECTOR.search(name):
        return "projector"
    return "vision" if VISION_TOWER.search(name) else "language"


def set_trainable(model: Any, parts: frozenset[str]) -> None:
    """Full fine-tuning of the parts in `parts`; every other parameter frozen."""
    for name, param in model.named_parameters():
        param.requires_grad_(part_of(name) in parts)


def linear_modules(model: Any, parts: frozenset[str]) -> list[str]:
    """The names of the linear layers in `parts` (LoRA's targets), the LM head left out."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head and part_of(name) in parts]  # fmt: skip


def outermost_modules(model: Any, part: str) -> list[str]:
    """The outermost modules of a part (the projector, which LoRA trains whole: modules_to_save); a list of modules
    (Qwen3-VL's deepstack mergers) stands for its members."""
    import torch

    lists = (torch.nn.ModuleList, torch.nn.ModuleDict)
    names = [name for name, module in model.named_modules()
             if name and part_of(name) == part and not isinstance(module, lists)]  # fmt: skip
    return [name for name in names if not any(name.startswith(other + ".") for other in names)]


def check_frozen(model: Any, parts: frozenset[str], setting: str) -> None:
    """ConfigError when a part outside `parts` (the ones `setting` asks to train) holds a trainable parameter: the
    freeze it asked for did not hold."""
    leaks: dict[str, list[str]] = {}
    for name, param in model.named_parameters():
        if param.requires_grad and part_of(name) not in parts:
            leaks.setdefault(part_of(name), []).append(name)
    if leaks:
        said = [f"the {PARTS[part]} is to stay frozen but {len(names)} of its parameters would train ("
                f"{', '.join(names[:SHOWN_NAMES])}{', ...' if len(names) > SHOWN_NAMES else ''})"
                for part, names in leaks.items()]  # fmt: skip
        raise ConfigError(*said, f"{setting}: the freeze does not hold; name the parts to train there, or leave "
                                 "them out of TRAIN_LORA_TARGETS")  # fmt: skip
