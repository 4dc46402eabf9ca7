"""Transformers' own W&B and MLflow callbacks, given what trainkit tracks.

Transformers' callbacks log `TrainingArguments.to_dict()` as the run's params. trainkit hands them the resolved
TRAIN_* settings and decisions instead, as the run's record holds them (trainer.config.run_record's RunRecord, handed
in by the run), masked by the one secret rule (trainer.secrets): no token, password or credentialed URL reaches a
tracker. They run on the main process only; the run ids they start are recorded (in
OUTPUT_DIR/trackers.json and every later checkpoint's record) so that a resumed run continues them.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from transformers.integrations import MLflowCallback, WandbCallback

from trainer.checkpoint_record import CheckpointRecord
from trainer.trackers.environment import save_runs
from trainer.trackers.outage import DropOnFailure, forget_mlflow_run


class RecordedRun(Protocol):
    """A run's record (trainer.config.run_record.RunRecord; config/ imports trackers/, so it is not imported here)."""

    def to_dict(self) -> dict[str, Any]:
        """run_config.json's content, secrets masked."""
        ...


def tracked_params(run: RecordedRun) -> dict[str, Any]:
    """`TRAIN_X` -> value, `decision/x` -> value and `hub/x` -> repo@commit, from the run's record (masked)."""
    data = run.to_dict()
    params: dict[str, Any] = {name: entry["value"] for name, entry in data["settings"].items()}
    params.update({f"decision/{name}": entry["value"] for name, entry in data["decisions"].items()})
    params.update({f"hub/{name}": f"{r.get('repo_id')}@{r.get('sha')}" for name, r in (data.get("hub") or {}).items()})
    return {k: v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v) for k, v in params.items()}


class _TrackedArguments:
    """TrainingArguments as the callbacks see them: everything as is, but `to_dict()` is the tracked params."""

    def __init__(self, args: Any, params: dict[str, Any]) -> None:
        self._args = args
        self._params = params

    def __getattr__(self, name: str) -> Any:
        return getattr(self._args, name)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._params)


class _RunRecord:
    """Where a started tracker run's id goes: this run's trackers.json and its checkpoints' records (`trackers`)."""

    def __init__(self, output_dir: str, runs: dict[str, dict[str, str]], checkpoints: CheckpointRecord) -> None:
        self.output_dir, self.runs, self.checkpoints = output_dir, runs, checkpoints

    def started(self, tracker: str, run: dict[str, str]) -> None:
        self.runs[tracker] = run
        self.checkpoints.trackers = self.runs
        save_runs(self.output_dir, self.runs)


class TrackedWandbCallback(DropOnFailure, WandbCallback):
    tracker = "W&B"

    def __init__(self, params: dict[str, Any], record: _RunRecord) -> None:
        super().__init__()
        self._params, self._record = params, record

    def setup(self, args: Any, state: Any, model: Any, **kwargs: Any) -> None:
        super().setup(_TrackedArguments(args, self._params), state, model, **kwargs)
        if state.is_world_process_zero and self._wandb.run is not None:
            self._record.started("wandb", {"run_id": self._wandb.run.id, "project": self._wandb.run.project})


class TrackedMLflowCallback(DropOnFailure, MLflowCallback):
    tracker = "MLflow"

    def forget(self) -> None:
        forget_mlflow_run(self)

    def __init__(self, params: dict[str, Any], record: _RunRecord, resumed: bool) -> None:
        super().__init__()
        self._params, self._record = params, record
        self._resumed = resumed  # a continued run keeps its params (MLflow refuses changing a logged param)

    def setup(self, args: Any, state: Any, model: Any) -> None:
        super().setup(_TrackedArguments(args, {} if self._resumed else self._params), state, model)
        run = self._ml_flow.active_run() if state.is_world_process_zero else None
        if run is not None:
            self._record.started("mlflow", {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id})


def install(trainer: Any, run: RecordedRun, output_dir: str, runs: dict[str, dict[str, str]], main_process: bool
            ) -> None:  # fmt: skip
    """Swap the Trainer's W&B/MLflow callbacks (from report_to) for the tracked ones; other ranks report nothing."""
    record = _RunRecord(output_dir, runs, trainer.checkpoint_record)
    if runs:
        trainer.checkpoint_record.trackers = runs
    params = tracked_params(run)
    if trainer.pop_callback(WandbCallback) is not None and main_process:
        trainer.add_callback(TrackedWandbCallback(params, record))
    if trainer.pop_callback(MLflowCallback) is not None and main_process:
        trainer.add_callback(TrackedMLflowCallback(params, record, resumed="mlflow" in runs))
