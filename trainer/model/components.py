"""What a model is made of, by component: one classifier of parameter names, one table of parameters per component
(total, trainable), and the freezing that the table proves.

Components are named by patterns on parameter names, first match wins (PEFT's prefixes and adapter names do not
change a parameter's component: a LoRA weight inside the vision tower is the vision tower's):
- `projector`: what maps image features into the language model (LLaVA's and Gemma 3's multi_modal_projector,
  Idefics3's connector, Qwen-VL's patch merger);
- `vision`: the vision tower (Qwen-VL's visual, vision_tower, vision_model);
- `language`: everything else: the language model, its embeddings and its head.
The run logs the table before step 0 and writes it to the run's record; a component asked to stay frozen that holds
a trainable parameter is a ConfigError (exit 2) naming it, never a silent partial freeze.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from trainer.errors import ConfigError

log = logging.getLogger("trainer")

COMPONENTS: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("projector", "projector", re.compile(
        r"(^|\.)(multi_modal_projector|mm_projector|connector|visual\.merger|visual\.deepstack_merger_list)(\.|$)")),
    ("vision", "vision tower", re.compile(r"(^|\.)(visual|vision_tower|vision_model|vision_encoder)(\.|$)")),
    ("language", "language model", re.compile(r".")),
)  # fmt: skip
LABELS = {key: label for key, label, _ in COMPONENTS}
SHOWN_NAMES = 3


def component_of(name: str) -> str:
    """The component a parameter (or module) name belongs to."""
    return next(key for key, _, pattern in COMPONENTS if pattern.search(name))


@dataclass(frozen=True)
class Row:
    component: str
    total: int
    trainable: int

    def to_dict(self) -> dict[str, Any]:
        return {"component": self.component, "label": LABELS.get(self.component, self.component),
                "total": self.total, "trainable": self.trainable}  # fmt: skip


def table(model: Any) -> list[Row]:
    """Parameters per component (each tensor once, tied ones included once), in COMPONENTS' order; components the
    model lacks are left out."""
    totals: dict[str, list[int]] = {key: [0, 0] for key, _, _ in COMPONENTS}
    seen: set[int] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            continue
        seen.add(id(param))
        n = _numel(param)
        counts = totals[component_of(name)]
        counts[0] += n
        counts[1] += n if param.requires_grad else 0
    return [Row(key, total, trainable) for key, (total, trainable) in totals.items() if total]


def _numel(param: Any) -> int:
    """Elements of a parameter: its full size under ZeRO-3 (`ds_numel`), 4-bit weights counted as the weights."""
    n = int(getattr(param, "ds_numel", 0) or param.numel())
    return n * 2 if param.__class__.__name__ == "Params4bit" else n


def format_table(rows: list[Row]) -> str:
    """The table as the log shows it, one line per component and a total."""
    width = max([len(LABELS.get(r.component, r.component)) for r in rows] + [len("total")])
    lines = [f"{'component':<{width}}  {'parameters':>14}  {'trainable':>14}"]
    for r in [*rows, Row("total", sum(r.total for r in rows), sum(r.trainable for r in rows))]:
        share = f" ({100 * r.trainable / r.total:.1f}%)" if r.total else ""
        lines.append(f"{LABELS.get(r.component, r.component):<{width}}  {r.total:>14,}  {r.trainable:>14,}{share}")
    return "\n".join(lines)


def log_table(model: Any) -> list[dict[str, Any]]:
    """Log the table (before step 0) and return it as the run's record writes it."""
    rows = table(model)
    log.info("parameters by component:\n%s", format_table(rows))
    return [r.to_dict() for r in rows]


def set_trainable(model: Any, parts: frozenset[str]) -> None:
    """Full fine-tuning of the components in `parts`; every other parameter frozen."""
    for name, param in model.named_parameters():
        param.requires_grad_(component_of(name) in parts)


def linear_modules(model: Any, parts: frozenset[str]) -> list[str]:
    """The names of the linear layers in the components `parts` (LoRA's targets), the LM head left out."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head and component_of(name) in parts]  # fmt: skip


def outermost_modules(model: Any, component: str) -> list[str]:
    """The outermost modules of a component (e.g. the projector, which LoRA trains whole: modules_to_save); a list
    of modules (Qwen3-VL's deepstack mergers) stands for its members."""
    import torch

    lists = (torch.nn.ModuleList, torch.nn.ModuleDict)
    names = [name for name, module in model.named_modules()
             if name and component_of(name) == component and not isinstance(module, lists)]  # fmt: skip
    return [name for name in names if not any(name.startswith(other + ".") for other in names)]


def check_frozen(model: Any, parts: frozenset[str], setting: str) -> None:
    """ConfigError when a component outside `parts` (the ones asked to train, by `setting`) holds a trainable
    parameter: the freeze it asked for did not hold."""
    leaks: dict[str, list[str]] = {}
    for name, param in model.named_parameters():
        component = component_of(name)
        if param.requires_grad and component not in parts:
            leaks.setdefault(component, []).append(name)
    if leaks:
        said = [f"the {LABELS[c]} is to stay frozen but {len(names)} of its parameters would train ("
                f"{', '.join(names[:SHOWN_NAMES])}{', ...' if len(names) > SHOWN_NAMES else ''})"
                for c, names in leaks.items()]  # fmt: skip
        raise ConfigError(*said, f"{setting}: the freeze does not hold; name the components to train there, or "
                                 "leave them out of TRAIN_LORA_TARGETS")  # fmt: skip
