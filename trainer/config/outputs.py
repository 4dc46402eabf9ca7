"""The outputs group's home (TRAIN_REPORT_TO, TRAIN_PUSH_TO_HUB): the trackers and the Hub push; their checks,
decisions and TrainingArguments. The trackers themselves are trainer/trackers/, the upload trainer/hub/push.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config.decision import Decision, Decisions, SoFar
from trainer.errors import ConfigError
from trainer.hub.push import push_problems
from trainer.machine.hardware import module_available
from trainer.trackers.choice import MODULES, PACKAGES, parse_report_to
from trainer.trackers.environment import run_name

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.config.schema import TrainSettings
    from trainer.machine.hardware import Hardware


def problems(inputs: Inputs) -> list[str]:
    return push_problems(inputs.settings)


def decide_report_to(s: TrainSettings) -> Decision:
    """TRAIN_REPORT_TO as Transformers' report_to; a named tracker whose package is missing is a ConfigError (the
    default TensorBoard, when missing, is dropped with that reason: metrics.jsonl is still written)."""
    chosen = parse_report_to(s.report_to)
    missing = [t for t in chosen if not any(module_available(m) for m in MODULES[t])]
    if missing == ["tensorboard"] and "report_to" not in s.model_fields_set:
        return Decision("none", "tensorboard is not installed: no TensorBoard logs (metrics.jsonl is still written)")
    if missing:
        need = ", ".join(PACKAGES[t] for t in missing)
        raise ConfigError(f"TRAIN_REPORT_TO={s.report_to}: {need} is not installed in this environment (the images "
                          "have it; outside them: pip install -e '.[train]'), or leave it out of TRAIN_REPORT_TO")
    if not chosen:
        return Decision("none", "TRAIN_REPORT_TO=none: no tracker (metrics.jsonl is still written)")
    where = {"tensorboard": "TensorBoard in OUTPUT_DIR/runs", "wandb": "W&B (WANDB_*)",
             "mlflow": "MLflow (MLFLOW_TRACKING_URI, default OUTPUT_DIR/mlruns)"}  # fmt: skip
    return Decision(chosen, "; ".join(where[t] for t in chosen) + "; rank 0 reports")


def decide(inputs: Inputs, hardware: Hardware, so_far: SoFar) -> dict[str, Decision]:
    return {"report_to": so_far.attempt(decide_report_to, inputs.settings, fallback=Decision("none", "refused"))}


def arguments(settings: TrainSettings, decisions: Decisions, hardware: Hardware) -> dict[str, Any]:
    return {
        "logging_dir": str(Path(settings.output_dir) / "runs"),
        "report_to": decisions.report_to.value,
        "run_name": run_name(settings.output_dir),  # the trackers' run name (trainer.trackers)
    }
