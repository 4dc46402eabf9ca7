"""`RunConfig`: the resolved run, frozen. Its record, OUTPUT_DIR/run_config.json, is trainer.config.run_record's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainer.config.decision import Decisions
from trainer.config.inputs import Inputs
from trainer.config.schema import TrainSettings

if TYPE_CHECKING:
    from trainer.machine.hardware import Hardware


@dataclass(frozen=True)
class RunConfig:
    """The resolved run: settings with what they name (Hub snapshots, data scans), every derived decision with its
    reason, and what Transformers is given. Nothing is added to it while the run goes: what the run learns (the
    searched batch, the data's counts, the start-up phases) goes into its record (trainer.config.run_record)."""

    inputs: Inputs
    hardware: Hardware
    decisions: Decisions
    training_arguments: dict[str, Any]
    deepspeed: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)  # process environment the run sets (before torch)

    @property
    def settings(self) -> TrainSettings:
        return self.inputs.settings

    @property
    def hub(self) -> dict[str, Any]:
        """The Hub IDs resolved to commits (trainer.hub), as run_config.json and every checkpoint record them."""
        return self.inputs.hub.record()
