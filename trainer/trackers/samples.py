"""Sample tables to the run's trackers, through the clients Transformers' own callbacks opened: TensorBoard text (a
Markdown table per step), a W&B table and an MLflow artifact (`samples/step-NNNNNNN.jsonl`). Two tables: the
answers of TRAIN_EVAL_GENERATE (trainer.run.samples' EvalSamplesCallback, `eval/samples`) and online RL's sampled
completions with their rewards (its CompletionSamplesCallback, `train/completions`). The rows come masked. A tracker
that fails is logged once and left out of later samples; training never waits on it (trainer.trackers.outage)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.secrets import mask_value

log = logging.getLogger("trainer")


@dataclass(frozen=True)
class Table:
    """What a tracker shows of a row: its tag, its columns and each row's cells (text or numbers)."""

    tag: str
    columns: tuple[str, ...]
    cells: Callable[[dict[str, Any]], list[Any]]
    setting: str  # what made the samples, named in a tracker's refusal


def question_of(row: dict[str, Any]) -> str:
    """The question as one text: the prompt, or the conversation's turns as `role: content` lines."""
    if "messages" in row:
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in row["messages"])
    return str(row.get("prompt", ""))


EVAL_ANSWERS = Table("eval/samples", ("where", "question", "reference", "response"),
                     lambda row: [row["where"], question_of(row), row["reference"], row["response"]],
                     "TRAIN_EVAL_GENERATE")  # fmt: skip


def completions_table(reward_names: list[str], turns: bool = False) -> Table:
    """Online RL's sampled completions: prompt, completion, each reward by name and the weighted total; with tools
    the completion is the episode turn by turn, and `turns` counts the model's turns."""
    shown = ("completion", "turns") if turns else ("completion",)
    return Table("train/completions", ("step", "prompt", *shown, *reward_names, "reward"),
                 lambda row: [row["step"], row["prompt"], *(row[k] for k in shown),
                              *(row["rewards"].get(n) for n in reward_names), row["reward"]],
                 "TRAIN_METHOD's sampled completions")  # fmt: skip


def markdown(rows: list[dict[str, Any]], table: Table = EVAL_ANSWERS) -> str:
    """A Markdown table (TensorBoard's text tab renders it); cell text escaped so a `|` or newline keeps its cell."""

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(table.columns) + " |", "|" + " --- |" * len(table.columns)]
    lines += ["| " + " | ".join(cell(c) for c in table.cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def log_samples(callbacks: list[Any], step: int, rows: list[dict[str, Any]], failed: set[str],
                table: Table = EVAL_ANSWERS) -> None:  # fmt: skip
    """Each tracker among the Trainer's callbacks gets this step's rows."""
    for callback in callbacks:
        name = type(callback).__name__
        if name in failed or getattr(callback, "dropped", False):
            continue
        try:
            _log_to(callback, step, rows, table)
        except Exception as exc:  # a tracker's client: the samples are in samples.jsonl, the run goes on
            failed.add(name)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            log.warning("%s: %s refused the samples (%s: %s); they stay in samples.jsonl and are not sent to it "
                        "again", table.setting, name, type(exc).__name__, mask_value(first))  # fmt: skip


def _log_to(callback: Any, step: int, rows: list[dict[str, Any]], table: Table) -> None:
    from transformers.integrations import MLflowCallback, TensorBoardCallback, WandbCallback

    if isinstance(callback, TensorBoardCallback) and getattr(callback, "tb_writer", None) is not None:
        callback.tb_writer.add_text(table.tag, markdown(rows, table), step)
        callback.tb_writer.flush()
    elif isinstance(callback, WandbCallback) and callback._initialized and callback._wandb.run is not None:
        wandb_table = callback._wandb.Table(columns=list(table.columns), data=[table.cells(row) for row in rows])
        callback._wandb.log({table.tag: wandb_table, "train/global_step": step})
    elif isinstance(callback, MLflowCallback) and callback._initialized:
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        callback._ml_flow.log_text(text, f"samples/step-{step:07d}.jsonl")
