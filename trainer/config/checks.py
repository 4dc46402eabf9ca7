"""Stage 1: every check of the settings that needs no torch, each group's (trainer/config/groups.py), in three tiers:
the groups' own checks; then, only when there is none, the Hub (downloads, unless HF_HUB_OFFLINE=1); then the checks
of what it fetched."""

from __future__ import annotations

from trainer.config.groups import AFTER_HUB, HOMES
from trainer.config.inputs import Inputs


def static_problems(inputs: Inputs) -> list[str]:
    """Every problem that can be found without torch, in a stable order; the Hub is asked only when there is none.
    The Hub snapshots and data scans are kept on `inputs`, for `resolve` and the run."""
    problems = [problem for home in HOMES for problem in home.problems(inputs)] or inputs.hub_problems()
    for home in AFTER_HUB:
        if problems:
            break
        problems = home.problems_after_hub(inputs)
    return problems
