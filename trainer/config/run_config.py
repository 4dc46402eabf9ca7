"""`RunConfig`: the resolved run, and its record OUTPUT_DIR/run_config.json (secrets masked)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config.decisions import Decisions
from trainer.config.inputs import Inputs
from trainer.config.schema import TrainSettings, env_name
from trainer.secrets import mask_secrets

if TYPE_CHECKING:
    from trainer.machine.hardware import Hardware

# Environment variables recorded in run_config.json besides TRAIN_* (secrets among them are masked).
RECORDED_ENV_PREFIXES = (
    "TRAIN_", "HF_", "CUDA_", "NCCL_", "TORCH", "PYTORCH_", "TRANSFORMERS_", "TOKENIZERS_", "WANDB_", "OMP_"
)  # fmt: skip


@dataclass
class RunConfig:
    """The resolved run: settings with what they name (Hub snapshots, data scans), every derived decision with its
    reason, and what Transformers is given."""

    inputs: Inputs
    hardware: Hardware
    decisions: Decisions
    training_arguments: dict[str, Any]
    deepspeed: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)  # process environment the run sets (before torch)
    startup: dict[str, Any] = field(default_factory=dict)  # seconds per start-up phase (trainer.run.startup)
    training_data: dict[str, Any] = field(default_factory=dict)  # batches per epoch, what is left out (run.train)

    @property
    def settings(self) -> TrainSettings:
        return self.inputs.settings

    @property
    def hub(self) -> dict[str, Any]:
        """The Hub IDs resolved to commits (trainer.hub), as run_config.json and every checkpoint record them."""
        return self.inputs.hub.record()

    def to_dict(self, masked: bool = True, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        source = self.settings.model_fields_set
        data = {
            "settings": {
                env_name(name): {"value": value, "source": "env" if name in source else "default"}
                for name, value in self.settings.model_dump().items()
            },
            "decisions": self.decisions.to_dict(),
            "hardware": self.hardware.to_dict(),
            "training_arguments": self.training_arguments,
            "deepspeed": self.deepspeed,
            "hub": self.hub,
            "startup": self.startup,
            "training_data": self.training_data,
            "environment": {**recorded_environment(os.environ if environ is None else environ), **self.env},
        }
        data = json.loads(json.dumps(data, default=str))
        return mask_secrets(data) if masked else data

    def write_run_config(self, output_dir: str | Path | None = None) -> Path:
        """OUTPUT_DIR/run_config.json (secrets masked), written atomically."""
        folder = Path(output_dir or self.settings.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "run_config.json"
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(masked=True), indent=2, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, target)
        return target


def write_run_config(cfg: RunConfig, output_dir: str | Path | None = None) -> Path:
    """Module-level form of RunConfig.write_run_config."""
    return cfg.write_run_config(output_dir)


def recorded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)}
