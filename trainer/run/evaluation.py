"""Evaluation: the eval dataset (TRAIN_EVAL_DATA or TRAIN_EVAL_SPLIT), and its loss and perplexity in metrics.jsonl
and TensorBoard. When and how often is Transformers' own (eval_strategy/eval_steps, load_best_model_at_end for
TRAIN_KEEP_BEST: trainer.config.training_arguments)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from trainer.run.metrics import append_line, json_line, method_metrics

if TYPE_CHECKING:
    from trainer.config.inputs import Inputs
    from trainer.data.dataset import BlockRange, ShardedDataset

log = logging.getLogger("trainer")


def split_datasets(inputs: Inputs, tokenizer: Any, train: ShardedDataset, should_stop: Callable[[], bool]
                   ) -> tuple[ShardedDataset | BlockRange, ShardedDataset | BlockRange | None]:  # fmt: skip
    """(training dataset, eval dataset or None) per TRAIN_EVAL_DATA / TRAIN_EVAL_SPLIT."""
    from trainer.data.dataset import hold_out, load_or_prepare

    settings = inputs.settings
    if settings.eval_split > 0:
        train, held = hold_out(train, settings.eval_split)
        log.info("eval: %d packed sequences held out (TRAIN_EVAL_SPLIT=%g), %d train", len(held),
                 settings.eval_split, len(train))  # fmt: skip
        return train, held
    if not settings.eval_data:
        return train, None
    source = inputs.eval_data
    evaluation = load_or_prepare(source, tokenizer, inputs.data_spec, inputs.cache_dir, should_stop)
    log.info("eval: %s (%s), %d packed sequences", source.describe(), source.reason, len(evaluation))
    return train, evaluation


class EvalMetricsCallback(TrainerCallback):
    """Each evaluation: perplexity added to the logs (so TensorBoard shows eval/perplexity) and one line in
    metrics.jsonl: {"step", "epoch", "eval_loss", "eval_perplexity", "eval_runtime_s", "eval_samples_per_s", "time"}.
    It must run before the TensorBoard callback: `install` puts it first."""

    def __init__(self, path: Path, perplexity: bool = True) -> None:
        self.path, self.perplexity = path, perplexity  # a preference method's eval_loss is no language-model loss

    def install(self, trainer: Any) -> None:
        trainer.callback_handler.callbacks.insert(0, self)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "eval_loss" not in logs:
            return
        loss = float(logs["eval_loss"])
        if self.perplexity:
            logs["eval_perplexity"] = math.exp(loss) if loss < 700 else math.inf
        if not state.is_world_process_zero:
            return
        perplexity = logs.get("eval_perplexity", math.inf)
        record = {
            "step": state.global_step,
            "epoch": logs.get("epoch", state.epoch),
            "eval_loss": loss,
            **({"eval_perplexity": perplexity if math.isfinite(perplexity) else None} if self.perplexity else {}),
            "eval_runtime_s": logs.get("eval_runtime"),
            "eval_samples_per_s": logs.get("eval_samples_per_second"),
            "time": time.time(),
            **method_metrics(logs, "eval_"),
        }
        append_line(self.path, json_line(record))  # strict JSON: a NaN eval loss is null
