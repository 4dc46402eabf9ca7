"""`eval`'s summary to the tracker runs of the training run the model came from (OUTPUT_DIR/trackers.json, the ids
a resume continues: trainer.trackers.environment): MLflow gets the metrics `eval_results/<name>` at the model's
step (through MLFLOW_TRACKING_URI, else the run's own file store OUTPUT_DIR/mlruns), W&B the same names in the
run's summary (offline under OUTPUT_DIR/wandb unless WANDB_API_KEY or WANDB_MODE say otherwise). A tracker that
cannot take them is named once, masked; the evaluation's own files are written either way."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from trainer.secrets import mask_value
from trainer.trackers.environment import MLFLOW_CLIENT_DEFAULTS, previous_runs, split_credentials

log = logging.getLogger("trainer")

PREFIX = "eval_results/"


def report_to_run(run_dir: Path, metrics: dict[str, float], step: int | None) -> list[str]:
    """The tracker runs that got `metrics` (e.g. ["MLflow run 3f2a..."]); none when the run recorded none."""
    runs = previous_runs(str(run_dir), True, {})
    reported = []
    for tracker, send in (("mlflow", _mlflow), ("wandb", _wandb)):
        run = runs.get(tracker)
        if not isinstance(run, dict) or not run.get("run_id"):
            continue
        try:
            send(run_dir, run, metrics, step)
            reported.append(f"{'MLflow' if tracker == 'mlflow' else 'W&B'} run {run['run_id']}")
        except Exception as exc:  # the tracker's client or server: the evaluation stands without it
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            unset = tracker == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI")
            hint = "; set MLFLOW_TRACKING_URI to the server the run used" if unset else ""
            log.warning("eval: the results could not be sent to the run's %s run %s (%s: %s); they are in the "
                        "output folder%s", tracker, run["run_id"], type(exc).__name__, mask_value(first),
                        hint)  # fmt: skip
    return reported


def _mlflow(run_dir: Path, run: dict[str, str], metrics: dict[str, float], step: int | None) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir.resolve() / "mlruns").as_uri()
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    else:
        for name, value in MLFLOW_CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
    bare, user, password = split_credentials(uri)
    if user is not None:  # MLflow's own basic-auth variables, as the run used them
        os.environ.setdefault("MLFLOW_TRACKING_USERNAME", user)
        os.environ.setdefault("MLFLOW_TRACKING_PASSWORD", password or "")
    now = int(time.time() * 1000)
    logged = [Metric(PREFIX + name, value, now, step or 0) for name, value in metrics.items()]
    MlflowClient(tracking_uri=bare).log_batch(run["run_id"], metrics=logged)


def _wandb(run_dir: Path, run: dict[str, str], metrics: dict[str, float], step: int | None) -> None:
    import wandb

    mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    resumed = wandb.init(id=run["run_id"], project=run.get("project"), resume="allow", dir=str(run_dir),
                         mode=mode)  # type: ignore[arg-type]  # WANDB_MODE is the user's string; wandb checks it
    try:
        resumed.summary.update({PREFIX + name: value for name, value in metrics.items()})
        resumed.summary[PREFIX + "step"] = step
    finally:
        resumed.finish()
