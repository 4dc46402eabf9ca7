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
EVAL_LAYOUTS = ("text, prompt/completion, messages, ShareGPT conversations or conversational prompt/completion "
                "records, or preference pairs (prompt/chosen/rejected)")  # fmt: skip


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
    """The scan of --data; a missing or empty one is an error here (training would fall back to its corpus).
    Preference pairs are taken (trainer.evaluate.pairs scores them); KTO's unpaired records, or pairs mixed with
    other layouts, are not."""
    import dataclasses

    from trainer.data.discovery import discover
    from trainer.data.preference import PAIRED, PREFERENCE_LAYOUTS

    source = discover(data, spec.text_field, spec.max_bad_lines, "eval")
    problems = [p.replace("TRAIN_DATA", "eval --data", 1) for p in source.problems]
    if problems or source.embedded:
        raise ConfigError(*(problems or [f"eval --data {data}: no data there"]))
    blank = [str(path) for path in source.files if _only_blank(path)]
    if blank:
        raise ConfigError(f"eval --data {data}: {', '.join(blank)} holds only blank lines, no record to score; "
                          f"give {EVAL_LAYOUTS}")  # fmt: skip
    preference = [layout for layout in source.layouts if layout in PREFERENCE_LAYOUTS]
    if preference and (len(preference) < len(source.layouts) or not set(preference) <= set(PAIRED)):
        raise ConfigError(
            f"eval --data {data}: {source.layout_names()} records: eval takes {EVAL_LAYOUTS}, one kind per "
            "evaluation; not KTO's prompt/completion/label records (give them as pairs, or the answers to score as "
            "prompt/completion records)"
        )
    return dataclasses.replace(source, variable="eval --data")


def is_pairs(source: DataSource) -> bool:
    from trainer.data.preference import PAIRED

    return bool(source.layouts) and all(layout in PAIRED for layout in source.layouts)


def _only_blank(path: Path) -> bool:
    """A text or JSON file of blank lines (tokenization would find no record, after the model loaded)."""
    from trainer.data.formats import file_kind, open_text

    kind = file_kind(path) if path.is_file() else None
    if kind is None or kind.format not in ("jsonl", "json", "text"):
        return False
    with open_text(path) as handle:
        return not any(line.strip() for line in handle)


def packed(spec: DataSpec, source: DataSource, tokenizer: Any, cache_dir: Path) -> Any:
    from trainer.data.dataset import load_or_prepare

    return load_or_prepare(source, tokenizer, spec, cache_dir)


def loss_on(model: Any, dataset: Any, batch_size: int, device: Any) -> Loss:
    """The mean loss per trained token (labels != -100, shifted as the model's own loss shifts them)."""
    from trainer.model.packed_attention import collator_for, isolate_records

    attn = getattr(model.config, "_attn_implementation", None) or "sdpa"
    isolate_records(model, attn)  # no cache, and the records of a packed sequence kept apart, as in training
    collate = collator_for(attn)
    batches = (collate([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
               for start in range(0, len(dataset), batch_size))  # fmt: skip
    return loss_of_batches(model, batches, device, len(dataset))


def loss_of_batches(model: Any, batches: Any, device: Any, sequences: int) -> Loss:
    """The mean loss per trained token over collated batches (each with its `labels`)."""
    import torch

    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            batch = {k: v.to(device) for k, v in batch.items()}
            labels = batch.pop("labels")
            logits = model(**batch).logits.float()
            shifted = labels[..., 1:].reshape(-1)
            total += torch.nn.functional.cross_entropy(logits[..., :-1, :].reshape(-1, logits.shape[-1]), shifted,
                                                       ignore_index=-100, reduction="sum").item()  # fmt: skip
            tokens += int((shifted != -100).sum())
    if tokens == 0:
        raise ConfigError("eval --data: no trained tokens in it (every label is masked); nothing to score")
    return Loss(total / tokens, tokens, sequences)
