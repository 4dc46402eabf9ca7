"""Loss and perplexity on the trained tokens of an eval set, computed as training computes them: the data layer
tokenizes, packs and masks it (trainer.data: the same cache, labels -100 where no loss is taken) with the DataSpec
the run the model came from recorded (sequence length, packing, TRAIN_LOSS_ON...), and the model sees each
packed sequence as the training run's evaluation did (records kept apart: trainer.model.packed_attention)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.config.run_record import RunRecord
    from trainer.data.discovery import DataSource
    from trainer.data.spec import DataSpec

log = logging.getLogger("trainer")
EVAL_LAYOUTS = "text, prompt/completion, messages, ShareGPT conversations or conversational prompt/completion"


@dataclass
class Loss:
    loss: float
    trained_tokens: int
    sequences: int


def eval_spec(run: RunRecord | None, overrides: dict[str, str]) -> DataSpec:
    """What shapes the eval set's packed data: the DataSpec the run recorded (when the model came from a run; else
    the defaults), with this environment's TRAIN_* of its settings, then the command line's, on top."""
    import dataclasses

    from trainer.config.inputs import DATA_SPEC_SETTINGS, Inputs
    from trainer.config.parse import parse_settings
    from trainer.config.schema import env_name

    fields = {env_name(setting): field for field, setting in DATA_SPEC_SETTINGS.items()}  # TRAIN_SEQ_LEN: seq_len
    given = {name: os.environ[name] for name in fields if os.environ.get(name)} | overrides
    chosen = parse_settings(given)  # a bad value is one line of a ConfigError, as for training
    spec = run.data_spec if run is not None else Inputs(chosen).data_spec
    return dataclasses.replace(spec, **{fields[name]: getattr(chosen, DATA_SPEC_SETTINGS[fields[name]])
                                        for name in given})  # fmt: skip


def eval_source(data: str, spec: DataSpec) -> DataSource:
    """The scan of --data; a missing or empty one is an error here (training would fall back to its corpus)."""
    from trainer.data.discovery import discover
    from trainer.data.preference import PREFERENCE_LAYOUTS

    source = discover(data, spec.text_field, spec.max_bad_lines, "eval")
    problems = [p.replace("TRAIN_DATA", "eval --data", 1) for p in source.problems]
    if problems or source.embedded:
        raise ConfigError(*(problems or [f"eval --data {data}: no data there"]))
    pairs = [layout for layout in source.layouts if layout in PREFERENCE_LAYOUTS]
    if pairs:
        raise ConfigError(
            f"eval --data {data}: {source.layout_names()} records: eval scores the loss on the trained "
            f"tokens and the answers of {EVAL_LAYOUTS} records, not preference pairs; give the eval set in one of "
            "those layouts (e.g. each prompt with its chosen answer as `completion`), or watch the pairs' reward "
            "accuracy and margins in the preference run's own evaluation (TRAIN_EVAL_DATA)"
        )
    return source


def packed(spec: DataSpec, source: DataSource, tokenizer: Any, cache_dir: Path) -> Any:
    from trainer.data.dataset import load_or_prepare

    return load_or_prepare(source, tokenizer, spec, cache_dir)


def loss_on(model: Any, dataset: Any, batch_size: int, device: Any) -> Loss:
    """The mean loss per trained token (labels != -100, shifted as the model's own loss shifts them)."""
    import torch

    from trainer.model.packed_attention import collator_for, isolate_records

    attn = getattr(model.config, "_attn_implementation", None) or "sdpa"
    isolate_records(model, attn)  # no cache, and the records of a packed sequence kept apart, as in training
    collate = collator_for(attn)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(dataset), batch_size):
            batch = collate([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
            batch = {k: v.to(device) for k, v in batch.items()}
            labels = batch.pop("labels")
            logits = model(**batch).logits.float()
            shifted = labels[..., 1:].reshape(-1)
            total += torch.nn.functional.cross_entropy(logits[..., :-1, :].reshape(-1, logits.shape[-1]), shifted,
                                                       ignore_index=-100, reduction="sum").item()  # fmt: skip
            tokens += int((shifted != -100).sum())
    if tokens == 0:
        raise ConfigError("eval --data: no trained tokens in it (every label is masked); nothing to score")
    return Loss(total / tokens, tokens, len(dataset))
