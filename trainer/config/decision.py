"""`Decision`: one decided value and the reason for it (re-exported by trainer.config.decisions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Decision(Generic[T]):
    """One decided value and why."""

    value: T
    reason: str
