"""What a model is made of, by component: one classifier of parameter names and one table writer (parameters and
trainable parameters per component), logged before step 0 and kept in the run's record.

Components are named by patterns on parameter names, tried in order, the first that matches wins: a vision-language
model's projector and vision tower (trainer.model.vision_parts' patterns), then the language model (every other
parameter: its embeddings, layers and head).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from trainer.model.vision_parts import PROJECTOR, VISION_TOWER

log = logging.getLogger("trainer")

COMPONENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("projector", PROJECTOR),
    ("vision tower", VISION_TOWER),
    ("language model", re.compile(r"")),
)


def component_of(name: str) -> str:
    return next(component for component, pattern in COMPONENTS if pattern.search(name))


@dataclass(frozen=True)
class Count:
    """One row of the table."""

    component: str
    parameters: int
    trainable: int

    def to_dict(self) -> dict[str, Any]:
        return {"component": self.component, "parameters": self.parameters, "trainable": self.trainable}


def _numel(param: Any) -> int:
    """Elements of a parameter: its full size under ZeRO-3 (`ds_numel`), 4-bit weights counted as the weights."""
    n = int(getattr(param, "ds_numel", 0) or param.numel())
    return n * 2 if param.__class__.__name__ == "Params4bit" else n


def count(model: Any) -> list[Count]:
    """The model's rows in COMPONENTS' order (components it lacks left out; tied tensors once) and a last row
    "total"."""
    totals = {component: [0, 0] for component, _ in COMPONENTS}
    for name, param in model.named_parameters():
        n = _numel(param)
        counts = totals[component_of(name)]
        counts[0] += n
        counts[1] += n if param.requires_grad else 0
    found = [Count(name, total, trainable) for name, (total, trainable) in totals.items() if total]
    return [*found, Count("total", sum(r.parameters for r in found), sum(r.trainable for r in found))]


def table_lines(rows: list[Count]) -> list[str]:
    """The table as aligned text lines (a header, one line per row, the trainable share)."""
    cells = [("component", "parameters", "trainable"),
             *[(r.component, f"{r.parameters:,}", f"{r.trainable:,} ({100 * r.trainable / max(r.parameters, 1):.1f}%)")
               for r in rows]]  # fmt: skip
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    return ["  ".join(c[0].ljust(widths[0]) if i == 0 else c[i].rjust(widths[i]) for i in range(3)) for c in cells]


def log_components(model: Any) -> list[Count]:
    """Log the table (before step 0) and return it, as the run's record keeps it."""
    rows = count(model)
    log.info("components:\n  %s", "\n  ".join(table_lines(rows)))
    return rows
