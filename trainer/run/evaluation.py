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

from trainer.jsonl import append_line, json_line
from trainer.run.metrics import method_metrics

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Trainer, TrainerControl, TrainerState, TrainingArguments

    from trainer.config.inputs import Inputs
    from trainer.data.dataset import BlockRange, ShardedDataset

log = logging.getLogger("trainer")


def training_data(
    inputs: Inputs, tokenizer: PreTrainedTokenizerBase, should_stop: Callable[[], bool]
) -> tuple[Any, Any]:
    """(training dataset, eval dataset: None, one dataset, or {name: dataset} for several eval sets, which
    Transformers evaluates one by one as eval_<name>_loss). A mix of sources (trainer.data.mix) is prepared source by
    source and mixed with TRAIN_SEED; its TRAIN_EVAL_SPLIT holds out the same fraction of each source, by name."""
    from trainer.data.dataset import load_or_prepare
    from trainer.data.mixed import prepare_mix

    settings = inputs.settings
    if inputs.mix.is_mix:
        train, held = prepare_mix(inputs.mix, inputs.mix_sources, tokenizer, inputs.data_spec, inputs.cache_dir,
                                  settings.seed, settings.eval_split, should_stop)  # fmt: skip
        if held:
            log.info("eval: TRAIN_EVAL_SPLIT=%g held out per source: %s", settings.eval_split,
                     ", ".join(f"{name} {len(part)}" for name, part in held.items()))  # fmt: skip
            return train, held
        return train, eval_datasets(inputs, tokenizer, should_stop)
    dataset = load_or_prepare(inputs.data, tokenizer, inputs.data_spec, inputs.cache_dir, should_stop)
    return split_datasets(inputs, tokenizer, dataset, should_stop)


def split_datasets(inputs: Inputs, tokenizer: PreTrainedTokenizerBase, train: ShardedDataset,
                   should_stop: Callable[[], bool]) -> tuple[ShardedDataset | BlockRange, Any]:  # fmt: skip
    """(training dataset, eval dataset or None) per TRAIN_EVAL_DATA / TRAIN_EVAL_SPLIT."""
    from trainer.data.dataset import hold_out

    settings = inputs.settings
    if settings.eval_split > 0:
        kept, held = hold_out(train, settings.eval_split)
        log.info("eval: %d packed sequences held out (TRAIN_EVAL_SPLIT=%g), %d train", len(held),
                 settings.eval_split, len(kept))  # fmt: skip
        return kept, held
    return train, eval_datasets(inputs, tokenizer, should_stop)


def eval_datasets(inputs: Inputs, tokenizer: PreTrainedTokenizerBase, should_stop: Callable[[], bool]) -> Any:
    """TRAIN_EVAL_DATA prepared: None when unset, one dataset, or {name: dataset} for several named sets."""
    from trainer.data.dataset import load_or_prepare

    if not inputs.settings.eval_data:
        return None
    named = inputs.eval_sets or {"": inputs.eval_data}
    sets = {}
    for name, source in named.items():
        sets[name] = load_or_prepare(source, tokenizer, inputs.data_spec, inputs.cache_dir, should_stop)
        log.info("eval: %s%s (%s), %d packed sequences", f"{name}: " if name else "", source.describe(),
                 source.reason, len(sets[name]))  # fmt: skip
    return sets if inputs.eval_sets else sets[""]


class EvalMetricsCallback(TrainerCallback):
    """Each evaluation: perplexity added to the logs (so TensorBoard shows eval/perplexity) and one line in
    metrics.jsonl: {"step", "epoch", "eval_loss", "eval_perplexity", "eval_runtime_s", "eval_samples_per_s", "time"}.
    It must run before the TensorBoard callback: `install` puts it first."""

    def __init__(self, path: Path, perplexity: bool = True) -> None:
        self.path, self.perplexity = path, perplexity  # a preference method's eval_loss is no language-model loss

    def install(self, trainer: Trainer) -> None:
        trainer.callback_handler.callbacks.insert(0, self)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: object) -> None:  # fmt: skip
        prefix = eval_prefix(logs or {})
        if prefix is None or logs is None:
            return
        loss = float(logs[f"{prefix}loss"])
        if self.perplexity:
            logs[f"{prefix}perplexity"] = math.exp(loss) if loss < 700 else math.inf
        if not state.is_world_process_zero:
            return
        perplexity = logs.get(f"{prefix}perplexity", math.inf)
        named = {"eval_set": prefix[len("eval_") : -1]} if prefix != "eval_" else {}
        record = {
            "step": state.global_step,
            "epoch": logs.get("epoch", state.epoch),
            **named,
            f"{prefix}loss": loss,
            **({f"{prefix}perplexity": perplexity if math.isfinite(perplexity) else None} if self.perplexity else {}),
            f"{prefix}runtime_s": logs.get(f"{prefix}runtime"),
            f"{prefix}samples_per_s": logs.get(f"{prefix}samples_per_second"),
            "time": time.time(),
            **method_metrics(logs, prefix),
        }
        append_line(self.path, json_line(record))  # strict JSON: a NaN eval loss is null


def eval_prefix(logs: dict[str, Any]) -> str | None:
    """`eval_` for one eval set's logs, `eval_<name>_` for a named set's (Transformers' metric_key_prefix); None
    when the logs are no evaluation's."""
    if "eval_loss" in logs:
        return "eval_"
    named = [key[: -len("loss")] for key in logs if key.startswith("eval_") and key.endswith("_loss")]
    return named[0] if len(named) == 1 else None
