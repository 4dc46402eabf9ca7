"""The decisions: every `auto` resolved for this machine, each a typed value with the reason it was chosen, made by
the group that owns it (trainer/config/groups.py) in turn. `Decision`, `Decisions` and `SoFar` are
trainer/config/decision.py's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainer.config.decision import Decision, Decisions, SoFar
from trainer.config.groups import HOMES
from trainer.config.inputs import Inputs
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.machine.hardware import Hardware

__all__ = ["Decision", "Decisions", "decisions_of"]


def decisions_of(inputs: Inputs, hw: Hardware, environ: Mapping[str, str], import_heavy: bool = True) -> Decisions:
    """Every group's decisions; a ConfigError naming every problem any group met."""
    so_far = SoFar(environ, import_heavy)
    for home in HOMES:
        so_far.decided |= home.decide(inputs, hw, so_far)
    if so_far.problems:
        raise ConfigError(*so_far.problems)
    return Decisions(**so_far.decided)
