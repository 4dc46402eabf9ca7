"""Scores of one answer against its reference, and the summary over all of them. Text is compared with its
whitespace normalised (runs of spaces, tabs and newlines are one space; ends stripped)."""

from __future__ import annotations

import math
import re
from typing import Any


def normalised(text: str) -> str:
    return " ".join(text.split())


def scores(response: str, reference: str, pattern: re.Pattern[str] | None) -> dict[str, bool]:
    """exact_match, contains and (with --regex) regex for one answer."""
    answer, wanted = normalised(response), normalised(reference)
    out = {"exact_match": answer == wanted, "contains": wanted in answer}
    if pattern is not None:
        out["regex"] = pattern.search(response) is not None
    return out


def mean_of(records: list[dict[str, Any]], metric: str) -> float | None:
    values = [float(r[metric]) for r in records if metric in r]
    return sum(values) / len(values) if values else None


def perplexity(loss: float) -> float | None:
    """exp(loss); None where it overflows (JSON has no infinity)."""
    return math.exp(loss) if loss < 700 else None


def summary_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, value) lines of the printed table, in the order users read them."""
    rows = []
    for name in ("loss", "perplexity", "exact_match", "contains", "regex", "reward_accuracy", "margin", "chosen_logp",
                 "rejected_logp"):  # fmt: skip
        value = results.get(name)
        if value is not None:
            rows.append((name, f"{value:.4f}"))
    for name in ("trained_tokens", "sequences", "records_generated", "records_without_reference", "pairs",
                 "pairs_without_room"):  # fmt: skip
        if results.get(name) is not None:
            rows.append((name, str(results[name])))
    for task, metrics in results.get("tasks", {}).items():
        for name, value in metrics.items():
            rows.append((f"{task} {name}", f"{value:.4f}" if isinstance(value, float) else str(value)))
    return rows
