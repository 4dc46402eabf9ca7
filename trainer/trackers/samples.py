"""Answers generated during training (TRAIN_EVAL_GENERATE: trainer.run.samples) to the run's trackers, through the
clients Transformers' own callbacks opened: TensorBoard text (`eval/samples`, a Markdown table per step), a W&B
table (`eval/samples`) and an MLflow artifact (`samples/step-NNNNNNN.jsonl`). The rows come masked. A tracker that
fails is logged once and left out of later samples; training never waits on it (trainer.trackers.outage)."""

from __future__ import annotations

import json
import logging
from typing import Any

from trainer.secrets import mask_value

log = logging.getLogger("trainer")

COLUMNS = ("where", "question", "reference", "response")
TAG = "eval/samples"


def question_of(row: dict[str, Any]) -> str:
    """The question as one text: the prompt, or the conversation's turns as `role: content` lines."""
    if "messages" in row:
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in row["messages"])
    return str(row.get("prompt", ""))


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[row["where"], question_of(row), row["reference"], row["response"]] for row in rows]


def markdown(rows: list[dict[str, Any]]) -> str:
    """A Markdown table (TensorBoard's text tab renders it); cell text escaped so a `|` or newline keeps its cell."""

    def cell(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(c) for c in cells) + " |" for cells in table_rows(rows)]
    return "\n".join(lines)


def log_samples(callbacks: list[Any], step: int, rows: list[dict[str, Any]], failed: set[str]) -> None:
    """Each tracker among the Trainer's callbacks gets this step's rows."""
    for callback in callbacks:
        name = type(callback).__name__
        if name in failed or getattr(callback, "dropped", False):
            continue
        try:
            _log_to(callback, step, rows)
        except Exception as exc:  # a tracker's client: the samples are in samples.jsonl, the run goes on
            failed.add(name)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            log.warning("TRAIN_EVAL_GENERATE: %s refused the samples (%s: %s); they stay in samples.jsonl and are "
                        "not sent to it again", name, type(exc).__name__, mask_value(first))  # fmt: skip


def _log_to(callback: Any, step: int, rows: list[dict[str, Any]]) -> None:
    from transformers.integrations import MLflowCallback, TensorBoardCallback, WandbCallback

    if isinstance(callback, TensorBoardCallback) and getattr(callback, "tb_writer", None) is not None:
        callback.tb_writer.add_text(TAG, markdown(rows), step)
        callback.tb_writer.flush()
    elif isinstance(callback, WandbCallback) and callback._initialized and callback._wandb.run is not None:
        table = callback._wandb.Table(columns=list(COLUMNS), data=table_rows(rows))
        callback._wandb.log({TAG: table, "train/global_step": step})
    elif isinstance(callback, MLflowCallback) and callback._initialized:
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        callback._ml_flow.log_text(text, f"samples/step-{step:07d}.jsonl")
